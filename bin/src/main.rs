//! `corofuse`: export a disk image as one regular file over FUSE, and measure what it costs.

mod alloc_count;
mod bench;
mod bench_switch;
mod mount;
mod serve_loop;
mod serve_threads;
mod signals;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "corofuse", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export a raw image (or null:SIZE) over a regular file, in the foreground.
    Mount(mount::Args),
    /// Measure the export against a matrix of workloads (the lab), or the runtime (`bench switch`).
    Bench(bench::Args),
    /// Summarise a `corofuse mount --stats` JSON file.
    Stats(bench::stats_cmd::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount(args) => mount::run(&args),
        Command::Bench(args) => bench::run(args),
        Command::Stats(args) => bench::stats_cmd::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corofuse: {e}");
            ExitCode::FAILURE
        }
    }
}
