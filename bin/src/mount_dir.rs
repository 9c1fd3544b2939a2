//! `corofuse mount-dir`: export a directory tree (a passthrough of SOURCE_DIR) on a
//! directory, until SIGINT/SIGTERM or unmount: one export of a directory file system,
//! served as `corofuse mount`'s image export is (`server::Exports`, on loops of its own,
//! with the same transports, queues and accounting) and living the same foreground life
//! (`crate::foreground`: pidfile, signals, `--stats`).
//!
//! Permission model: the mount has `default_permissions`, so the kernel checks each
//! caller against the attributes the source reports, and the daemon acts with its own
//! credentials. Run as root (with `--allow-other` for other users to reach the mount),
//! a node a caller creates is then given to that caller (owner, and group unless the
//! directory is set-group-ID), as on a local file system; run as a user, the export is
//! that user's and new nodes are theirs. The file system itself is
//! `dir_export::DirFs`; what it answers how is documented there.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dir_export::{Cache, DirFs, DirOptions, MetadataPolicy, PassthroughPolicy};

use server::{Exports, Target};

use crate::foreground::{Foreground, ReportFn};
use crate::model::section;
use crate::serve_args::ServeArgs;
use crate::signals::SignalFd;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The directory to export
    source: PathBuf,
    /// An existing directory to mount it on
    mountpoint: PathBuf,
    /// Refuse every change (EROFS), and mount read-only
    #[arg(long)]
    read_only: bool,
    /// Seconds the kernel may cache names and attributes (0: ask every time)
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    timeout: f64,
    /// The page cache for file data: `never` (every read and write reaches the daemon),
    /// `auto` (cached while open, dropped at each open: others' changes show at the next
    /// open) or `always` (kept across opens: for a source nobody else changes)
    #[arg(long, value_enum, default_value = "auto")]
    cache: CacheArg,
    /// The kernel's writeback cache: writes gathered in the page cache and sent later in
    /// large pieces (faster small writes; data reaches the source at fsync, close or
    /// writeback, not at write(2))
    #[arg(long)]
    writeback: bool,
    /// Node descriptors kept open at most (default: half the open-file limit); past that
    /// the least recently used are closed and reopened from their file handles when next
    /// used (as root, on a source file system that has file handles), so the tree the
    /// kernel may cache is not bounded by the open-file limit
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    node_fds: Option<u64>,
    /// FUSE passthrough (Linux 6.9+, root): `auto` (reads, buffered writes and mappings
    /// go straight to the source file; O_DIRECT writers stay on the daemon, which runs
    /// their writes in parallel), `always` (every open, as libfuse's passthrough_hp) or
    /// `never`. Where the kernel lacks it, or with --writeback: one log line, and never
    #[arg(long, value_enum, default_value = "auto")]
    passthrough: PassthroughArg,
    /// Where metadata calls run in coroutine dispatch: `off-loop` (LOOKUP through io_uring,
    /// the others on helper threads: a call the source is slow to answer holds back no
    /// other request), `on-loop` (direct system calls: cheaper where the source answers
    /// from memory) or `auto` (off the loop on a network or FUSE source, on it on a local
    /// one)
    #[arg(long, value_enum, default_value = "auto")]
    metadata: MetadataArg,
    #[command(flatten)]
    serve: ServeArgs,
}

/// `--passthrough` as clap spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PassthroughArg {
    Auto,
    Always,
    Never,
}

/// `--metadata` as clap spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum MetadataArg {
    Auto,
    OffLoop,
    OnLoop,
}

/// `--cache` as clap spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum CacheArg {
    Never,
    Auto,
    Always,
}

pub fn run(args: &Args) -> Result<(), String> {
    // Before the export starts its helper threads, so that they inherit the blocked
    // signals (a signal they took would end the process instead of stopping it cleanly).
    let signals = SignalFd::new().map_err(|e| format!("signalfd: {e}"))?;
    args.serve.check()?;
    if !(args.timeout >= 0.0 && args.timeout.is_finite()) {
        return Err("--timeout must be a number of seconds, 0 or more".into());
    }
    let meta =
        std::fs::metadata(&args.source).map_err(|e| format!("{}: {e}", args.source.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", args.source.display()));
    }
    let options = DirOptions {
        read_only: args.read_only,
        timeout: Duration::from_secs_f64(args.timeout),
        cache: match args.cache {
            CacheArg::Never => Cache::Never,
            CacheArg::Auto => Cache::Auto,
            CacheArg::Always => Cache::Always,
        },
        writeback: args.writeback,
        node_fds: args
            .node_fds
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        passthrough: match args.passthrough {
            PassthroughArg::Auto => PassthroughPolicy::Auto,
            PassthroughArg::Always => PassthroughPolicy::Always,
            PassthroughArg::Never => PassthroughPolicy::Never,
        },
        metadata: match args.metadata {
            MetadataArg::Auto => MetadataPolicy::Auto,
            MetadataArg::OffLoop => MetadataPolicy::OffLoop,
            MetadataArg::OnLoop => MetadataPolicy::OnLoop,
        },
    };
    let fs =
        DirFs::new(&args.source, options).map_err(|e| format!("{}: {e}", args.source.display()))?;
    let name = args.source.display().to_string();
    let target = Target {
        mountpoint: args.mountpoint.clone(),
        name,
        directory: true,
        read_only: args.read_only,
    };
    let fs = Arc::new(fs);
    let counted = Arc::clone(&fs);
    let report: ReportFn = Box::new(move || {
        [
            section("dir", Some(counted.stats())),
            section("passthrough", counted.passthrough_stats()),
        ]
        .into_iter()
        .flatten()
        .collect()
    });
    let mut exports = Exports::default();
    (exports.add(EXPORT, fs, &target, &args.serve.options())).map_err(|e| e.to_string())?;
    let served = exports.background(EXPORT).expect("the export just added");
    let life = Foreground::new(&args.serve, &target.name, served, report);
    life.serve(signals, || exports.remove(EXPORT))
}

/// The id of `mount-dir`'s one export.
const EXPORT: &str = "mount-dir";
