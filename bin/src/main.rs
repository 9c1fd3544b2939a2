//! `corofuse`: export a disk image as one regular file over FUSE, and measure what it costs
//! (the measuring is the `lab` crate's: `bench` and `stats` parse their arguments with its
//! types and call into it).

mod alloc_count;
mod mount;
mod mount_dir;
mod out_file;
mod signals;
mod storage_daemon;
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
    /// Remove a corofuse mount, live or left behind by a killed daemon (never another's).
    Umount(umount::Args),
    /// Stand in for qemu-storage-daemon: its options (--blockdev, --export, --object,
    /// --chardev, --monitor, --pidfile, --daemonize) and QMP; see `storage-daemon --help`.
    /// The binary run under the name `qemu-storage-daemon` is this
    #[command(disable_help_flag = true)]
    StorageDaemon {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The name that makes the binary qemu-storage-daemon (a symlink to it).
const QSD_NAME: &str = "qemu-storage-daemon";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let invoked = argv.first().map(std::path::Path::new);
    let as_qsd = invoked
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == QSD_NAME);
    let storage_daemon = as_qsd || argv.get(1).is_some_and(|a| a == "storage-daemon");
    // qemu-storage-daemon is silent while all is well: warnings and errors only.
    let level = if storage_daemon { "warn" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp_millis()
        .init();
    if as_qsd {
        return storage_daemon::run(QSD_NAME, &argv[1..]);
    }
    if storage_daemon {
        return storage_daemon::run("corofuse storage-daemon", &argv[2..]);
    }
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
        Command::StorageDaemon { .. } => unreachable!("run before clap parses"),
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
