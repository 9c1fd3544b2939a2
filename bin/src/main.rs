//! `corofuse`: export a disk image as one regular file over FUSE, and measure what it costs.

mod bench_switch;
mod mount;
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
    /// Measure the runtime and the export.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Coroutine switch, spawn and io_uring round-trip costs against their floors (JSON).
    Switch(bench_switch::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount(args) => mount::run(&args),
        Command::Bench {
            what: BenchCommand::Switch(args),
        } => bench_switch::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corofuse: {e}");
            ExitCode::FAILURE
        }
    }
}
