//! `corofuse`: export a disk image as one regular file over FUSE. The measuring is a
//! binary of its own, `corofuse-lab` (the `lab` crate), which runs this one for its
//! exports: nothing of it is linked here.

mod alloc_count;
mod crash_check;
mod foreground;
mod model;
mod mount;
mod mount_dir;
mod out_file;
mod pidfile;
mod serve_args;
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
    /// More log lines on stderr: -v adds debug lines (each decision, each retry), -vv
    /// trace. RUST_LOG, when set, chooses instead (e.g. RUST_LOG=backend=debug)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Fewer log lines: -q only warnings and errors, -qq only errors
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "verbose")]
    quiet: u8,
}

impl Cli {
    /// The log level the flags ask for (info by default).
    fn log_level(&self) -> &'static str {
        match (self.verbose, self.quiet) {
            (0, 0) => "info",
            (1, _) => "debug",
            (2.., _) => "trace",
            (_, 1) => "warn",
            (_, _) => "error",
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Export a raw or qcow2 image (or null:SIZE) over a regular file, in the foreground.
    Mount(mount::Args),
    /// Export a directory tree (passthrough of SOURCE_DIR) on a directory, in the foreground.
    MountDir(mount_dir::Args),
    /// Check the crash states a power loss may leave, from a write log (mount --record-writes).
    CrashCheck(crash_check::Args),
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
    if as_qsd || argv.get(1).is_some_and(|a| a == "storage-daemon") {
        // qemu-storage-daemon is silent while all is well: warnings and errors only.
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
            .format_timestamp_millis()
            .init();
        return match as_qsd {
            true => storage_daemon::run(QSD_NAME, &argv[1..]),
            false => storage_daemon::run("corofuse storage-daemon", &argv[2..]),
        };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(cli.log_level()))
        .format_timestamp_millis()
        .init();
    let result = match cli.command {
        Command::Mount(args) => mount::run(&args),
        Command::MountDir(args) => mount_dir::run(&args),
        Command::Umount(args) => umount::run(&args),
        Command::CrashCheck(args) => crash_check::run(&args),
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
    eprintln!("corofuse: {}", one_line(&e.render().to_string()));
    ExitCode::from(2)
}

/// clap's error text in one line: everything before its usage, so that what is missing
/// (`<MOUNTPOINT>`) and clap's "did you mean" tip are kept, then where to read more (the
/// subcommand's own `--help` where the usage names one).
fn one_line(rendered: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let mut help = "corofuse --help".to_string();
    for line in rendered.lines().map(str::trim) {
        if let Some(usage) = line.strip_prefix("Usage: ") {
            let mut words = usage.split_whitespace();
            if let (Some(bin), Some(sub)) = (words.next(), words.next()) {
                if !sub.starts_with(['-', '<', '[']) {
                    help = format!("{bin} {sub} --help");
                }
            }
            break;
        }
        if !line.is_empty() && !line.starts_with("For more information") {
            parts.push(line.trim_start_matches("error: "));
        }
    }
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() {
            // clap's "[possible values: ...]" belongs to the sentence before it.
            let glued = text.ends_with(':') || part.starts_with('[');
            text.push_str(if glued { " " } else { "; " });
        }
        text.push_str(part);
    }
    if text.is_empty() {
        text.push_str("invalid arguments");
    }
    format!("{text} (see {help})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(argv: &[&str]) -> String {
        let e = Cli::try_parse_from(argv).err().expect("an error");
        one_line(&e.render().to_string())
    }

    #[test]
    fn verbose_and_quiet_choose_the_log_level() {
        let level = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().log_level();
        assert_eq!(level(&["corofuse", "mount", "i", "m"]), "info");
        assert_eq!(level(&["corofuse", "-v", "mount", "i", "m"]), "debug");
        assert_eq!(level(&["corofuse", "mount", "i", "m", "-vv"]), "trace");
        assert_eq!(level(&["corofuse", "mount", "-q", "i", "m"]), "warn");
        assert_eq!(level(&["corofuse", "mount", "-qq", "i", "m"]), "error");
        assert!(Cli::try_parse_from(["corofuse", "mount", "-v", "-q", "i", "m"]).is_err());
    }

    #[test]
    fn usage_errors_name_what_is_missing_and_what_was_meant() {
        assert_eq!(
            error_of(&["corofuse", "mount", "raw.img"]),
            "the following required arguments were not provided: <MOUNTPOINT> \
             (see corofuse mount --help)"
        );
        assert_eq!(
            error_of(&["corofuse", "mount", "raw.img", "x", "--writeable"]),
            "unexpected argument '--writeable' found; tip: a similar argument exists: \
             '--writable' (see corofuse mount --help)"
        );
        assert_eq!(
            error_of(&["corofuse", "mount", "i", "m", "--transport", "foo"]),
            "invalid value 'foo' for '--transport <TRANSPORT>' [possible values: dev, uring, \
             auto] (see corofuse --help)"
        );
        assert_eq!(
            error_of(&["corofuse", "mount", "i", "m", "--placement", "al"]),
            "invalid value 'al' for '--placement <PLACEMENT>' [possible values: adaptive, all]; \
             tip: a similar value exists: 'all' (see corofuse --help)"
        );
        let typo = error_of(&["corofuse", "mont"]);
        assert!(
            typo.starts_with("unrecognized subcommand 'mont'; tip: ")
                && typo.contains("'mount'")
                && typo.ends_with(" (see corofuse --help)"),
            "{typo}"
        );
    }
}
