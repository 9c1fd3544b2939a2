//! `corofuse`: export a disk image as one regular file over FUSE, and measure what it costs
//! (the measuring is the `lab` crate's: `bench` and `stats` parse their arguments with its
//! types and call into it).

mod alloc_count;
mod crash_check;
mod mount;
mod mount_dir;
mod out_file;
mod signals;
mod umount;

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
    /// Export a raw or qcow2 image (or null:SIZE) over a regular file, in the foreground.
    Mount(mount::Args),
    /// Export a directory tree (passthrough of SOURCE_DIR) on a directory, in the foreground.
    MountDir(mount_dir::Args),
    /// Measure the export against a matrix of workloads (the lab), or the runtime (`bench switch`).
    Bench(Box<lab::Args>),
    /// Summarise a `corofuse mount --stats` JSON file.
    Stats(lab::stats_cmd::Args),
    /// Check the crash states a power loss may leave, from a write log (mount --record-writes).
    CrashCheck(crash_check::Args),
    /// Remove a corofuse mount, live or left behind by a killed daemon (never another's).
    Umount(umount::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Mount(args) => mount::run(&args),
        Command::MountDir(args) => mount_dir::run(&args),
        Command::Bench(args) => lab::run(&args),
        Command::Stats(args) => lab::stats_cmd::run(&args),
        Command::Umount(args) => umount::run(&args),
        Command::CrashCheck(args) => crash_check::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corofuse: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--help` and `--version` print as clap renders them; a bad argument is one line on
/// stderr (scripts rely on one-line errors) and exit status 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    eprintln!(
        "corofuse: {} (see corofuse --help)",
        first.trim_start_matches("error: ")
    );
    ExitCode::from(2)
}
