//! `corofuse mount`: export an image over a regular file until SIGINT/SIGTERM or unmount.
//!
//! Order of events: open the image (taking QEMU's image locks unless `--no-lock`), mount,
//! answer INIT, write the pidfile, serve. On SIGINT/SIGTERM: stop taking requests, let
//! those in flight finish, flush the image, unmount, exit 0. SIGUSR1 writes the statistics without stopping. Every setup error is
//! one line on stderr and a non-zero exit status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend::{Ctx, Format, OpenOptions};
use fuse::init::InitConfig;
use fuse::mount::{MountOptions, ENABLE_URING};
use fuse::session::handshake;
use image_export::{Export, ExportOptions};
use runtime::CounterSnapshot;
use transport::accounting::OpReport;
use transport::FileSystem;
use transport::{QueueConfig, QueueStats};

use crate::signals::SignalFd;
use crate::{serve_loop, serve_threads};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// An image file (raw or qcow2), or null:SIZE (e.g. null:1G)
    image: String,
    /// An existing regular file (it may be the image itself)
    mountpoint: PathBuf,
    /// Allow writes (default: read-only, as in QEMU)
    #[arg(short = 'w', long)]
    writable: bool,
    /// Writes and truncation past the end resize the image
    #[arg(long)]
    growable: bool,
    /// Open the image with O_DIRECT
    #[arg(long)]
    direct: bool,
    /// The image's format: `raw` or `qcow2`. Default: qcow2 if the file starts with the
    /// qcow2 magic, else raw. A raw image that starts with the qcow2 magic is exported raw
    /// only with `--format raw`
    #[arg(long, value_name = "FORMAT", value_parser = parse_format)]
    format: Option<Format>,
    /// FUSE passthrough for a raw image file (Linux 6.9+, root): opens that only read go
    /// straight to the image file, at the device's speed; writable opens are served as
    /// without it (the size stays exact), their mappings passed through. Not for qcow2,
    /// null or --inject. Where the kernel lacks it: one log line, and the normal path
    #[arg(long)]
    passthrough: bool,
    /// Take no image locks (QEMU's locking=off). By default the image gets QEMU's lock
    /// bytes: a writable export keeps QEMU's writers (and other writable exports) out and
    /// is refused where one is in; a read-only export takes what a QEMU reader takes
    #[arg(long)]
    no_lock: bool,
    /// Fail or delay chosen image operations, to test error paths (rules: see --help)
    ///
    /// Comma-separated rules, tried in order for each operation of the backend; `--stats`
    /// counts what fired (section `inject`). The client gets exactly the errno.
    ///   OP[@START-END]:ERRNO[:WHEN]           fail the operations matched with ERRNO
    ///   delay:OP[@START-END]:DURATION[:WHEN]  hold them for DURATION (500us, 2ms, 1s)
    ///   seed=N                                seed of the N/M rules (default 0)
    /// OP: read, write, flush (fsync, close, the flush at exit), discard (PUNCH_HOLE),
    ///   zeroes (ZERO_RANGE), resize (truncate) or any. @START-END (END exclusive, or
    ///   open: @START-) matches only operations overlapping those bytes, e.g. @1M-2M.
    /// ERRNO: EIO, ENOSPC, EROFS, EDQUOT, ENOMEM, EAGAIN, ETIMEDOUT, ... or 1-511 (not
    ///   ENOSYS). WHEN: always (default), once, nth=N (the N-th operation matched), N/M
    ///   (probability, reproducible from the seed), after=SIZE (at most SIZE bytes of
    ///   the operations matched succeed: e.g. write:ENOSPC:after=64M).
    /// Example: read:EIO:1/100,write:ENOSPC:after=64M,flush:EIO:once,delay:read:2ms
    #[arg(long, value_name = "SPEC", value_parser = backend::inject::parse, verbatim_doc_comment)]
    inject: Option<backend::inject::Spec>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// How a mount is served, for `mount` and `mount-dir` alike.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Other users may access the mount
    #[arg(long)]
    pub allow_other: bool,
    /// Written once the mount is live
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<PathBuf>,
    /// Write the runtime's counters as JSON at exit and on SIGUSR1
    #[arg(long, value_name = "PATH")]
    pub stats: Option<PathBuf>,
    /// Reads of /dev/fuse kept outstanding
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub readers: u16,
    /// Send replies through io_uring instead of writev(2)
    #[arg(long)]
    pub ring_replies: bool,
    /// How requests run: `coroutine` (one per request, suspending on io_uring), `inline`
    /// (one at a time on the loop, blocking syscalls) or `threads:N` (N worker threads,
    /// blocking syscalls, like libfuse)
    #[arg(long, default_value = "coroutine", value_parser = parse_dispatch)]
    pub dispatch: Dispatch,
    /// Spin up to this long for the next request before sleeping (0: never). The window
    /// adapts (QEMU's poll-max-ns): it grows while requests come quickly and drops to 0
    /// after a long idle wait, so an idle export burns no CPU
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    pub poll_us: u64,
    /// Event loops (coroutine and inline dispatch): N threads, each with its own clone of
    /// the /dev/fuse fd, its own io_uring, coroutine and buffer pools. With N > 1, loop i
    /// is pinned to the i-th CPU this process may run on (cycling; `--cpus` to choose).
    /// Default: with coroutine dispatch, one per CPU this process may run on (at most 8;
    /// measured best: BENCHMARKS.md); with inline dispatch, 1
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub queues: Option<u16>,
    /// Pin loop i to the i-th CPU of this comma-separated list (cycling), e.g. 0,1
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    pub cpus: Option<Cpus>,
    /// How requests reach the loops: `dev` (reads of /dev/fuse), `uring` (FUSE over
    /// io_uring, Linux 6.14+ with the fuse module's enable_uring=Y: one queue of ring
    /// entries per CPU; loop i serves the queues of CPUs i, i+N, ...) or `auto` (uring where
    /// the kernel offers it, else dev with a warning)
    #[arg(long, default_value = "dev", value_parser = ["dev", "uring", "auto"])]
    pub transport: String,
    /// Ring entries per CPU queue with `--transport uring`
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub uring_depth: u16,
    /// Which of several /dev/fuse loops take requests (coroutine dispatch): `adaptive`
    /// (a loop whose CPU the client keeps busy steps back while another loop has room,
    /// and comes back to measure again; see transport::placement) or `all` (every loop,
    /// always)
    #[arg(long, default_value = "adaptive", value_parser = ["adaptive", "all"])]
    pub placement: String,
}

/// Most loops the default `--queues` starts.
const MAX_DEFAULT_QUEUES: usize = 8;

/// The loops to run and the CPUs to pin them to: `--queues` as given, else the default
/// (see `Args::queues`); `--cpus` as given, else, with more than one loop, loop i on the
/// i-th CPU this process may run on (cycling). Several loops are always pinned: unpinned,
/// the one that shares the client's CPU is not the one that serves it, and FUSE over
/// io_uring, whose queue of CPU c must be served on c, loses its point.
fn plan_loops(args: &ServeArgs) -> (usize, Vec<usize>) {
    plan_loops_on(args, runtime::affinity::allowed_cpus().unwrap_or_default())
}

fn plan_loops_on(args: &ServeArgs, mut allowed: Vec<usize>) -> (usize, Vec<usize>) {
    let n = match (args.queues, args.dispatch) {
        (Some(n), _) => usize::from(n),
        (None, Dispatch::Coroutine) => allowed.len().clamp(1, MAX_DEFAULT_QUEUES),
        (None, _) => 1,
    };
    allowed.truncate(n);
    let pin = if n > 1 { allowed } else { Vec::new() };
    (n, args.cpus.as_ref().map_or(pin, |c| c.0.clone()))
}

/// The dispatch as it runs, spelled as on the command line: the mode, plus the queues
/// and the transport if not the defaults, e.g. `coroutine --queues 2 --transport uring`
/// (`--transport auto` is named by what it chose: `uring` here, nothing for /dev/fuse).
fn describe_dispatch(args: &ServeArgs, queues: usize, uring: bool) -> String {
    let mut text = args.dispatch.to_string();
    if queues > 1 {
        text += &format!(" --queues {queues}");
    }
    if uring {
        text += " --transport uring";
    }
    text
}

/// Whether the fuse module offers FUSE over io_uring; if not, why and how to turn it on.
fn uring_switch() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING).map(|v| v.trim() == "Y") {
        Ok(true) => Ok(()),
        state => Err(format!(
            "FUSE over io_uring is off ({ENABLE_URING} is {}); enable it with `echo Y > {ENABLE_URING}` \
             as root (Linux 6.14+)",
            if state.is_ok() { "N" } else { "missing" }
        )),
    }
}

/// A `--cpus` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpus(Vec<usize>);

fn parse_cpus(text: &str) -> Result<Cpus, String> {
    let cpus: Result<Vec<usize>, _> = text.split(',').map(|c| c.trim().parse()).collect();
    match cpus {
        Ok(cpus) if !cpus.is_empty() => Ok(Cpus(cpus)),
        _ => Err("expected CPU numbers separated by commas, e.g. 0,1".into()),
    }
}

/// How requests are dispatched (`--dispatch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// One coroutine per request on the io_uring loop.
    Coroutine,
    /// Requests one at a time on the loop, blocking syscalls.
    Inline,
    /// N worker threads, blocking syscalls.
    Threads(usize),
}

impl std::fmt::Display for Dispatch {
    /// As given on the command line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dispatch::Coroutine => f.write_str("coroutine"),
            Dispatch::Inline => f.write_str("inline"),
            Dispatch::Threads(n) => write!(f, "threads:{n}"),
        }
    }
}

fn parse_dispatch(text: &str) -> Result<Dispatch, String> {
    match text {
        "coroutine" => Ok(Dispatch::Coroutine),
        "inline" => Ok(Dispatch::Inline),
        _ => match text.strip_prefix("threads:").map(str::parse::<usize>) {
            Some(Ok(n)) if (1..=256).contains(&n) => Ok(Dispatch::Threads(n)),
            _ => Err("expected coroutine, inline or threads:N (N from 1 to 256)".into()),
        },
    }
}

/// What the file system adds to `--stats`: the backend's counters, for an image export.
#[derive(Default)]
pub struct BackendReport {
    pub backend: Option<backend::BackendStats>,
    pub inject: Option<backend::InjectStats>,
    pub dir: Option<dir_export::DirStats>,
    pub passthrough: Option<fuse::backing::PassthroughStats>,
}

/// Reads the file system's own counters for `--stats`, at any time.
pub type ReportFn = Box<dyn Fn() -> BackendReport + Send + Sync>;

/// Everything a serving loop needs once the mount is live.
pub struct Serving<F: FileSystem> {
    pub args: ServeArgs,
    pub export: Arc<F>,
    /// What `--stats` names the export by (the image, or the source directory).
    pub name: String,
    pub report: ReportFn,
    pub session: fuse::dev::FuseDev,
    pub max_write: u32,
    pub signals: SignalFd,
    /// The transport in use is FUSE over io_uring.
    pub uring: bool,
    /// Event loops (`--queues`, or the default), and the CPUs to pin them to, loop i to
    /// the i-th (empty: no pinning).
    pub queues: usize,
    pub cpus: Vec<usize>,
    /// The dispatch as `--stats` names it (`describe_dispatch`).
    pub dispatch: String,
}

impl<F: FileSystem> Serving<F> {
    pub fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            readers: self.args.readers as usize,
            ring_replies: self.args.ring_replies,
            inline: self.args.dispatch == Dispatch::Inline,
            account: self.accounting(),
        }
    }

    /// Per-request accounting is on when there is somewhere to write it (`--stats`).
    pub fn accounting(&self) -> bool {
        self.args.stats.is_some()
    }

    pub fn poll_ns(&self) -> u64 {
        self.args.poll_us * 1000
    }

    /// Whether requests come through FUSE over io_uring (`--transport uring`, or `auto`
    /// where the kernel granted it).
    pub fn uring(&self) -> bool {
        self.uring
    }

    /// Whether the loops' placement adapts ([`transport::placement`]): several
    /// coroutine loops on /dev/fuse, unless `--placement all`.
    pub fn adaptive_placement(&self) -> bool {
        self.queues > 1
            && !self.uring
            && self.args.dispatch == Dispatch::Coroutine
            && self.args.placement == "adaptive"
    }

    /// Ring entries per CPU queue.
    pub fn uring_depth(&self) -> usize {
        usize::from(self.args.uring_depth)
    }

    /// Makes the export durable once the last request is done.
    pub fn flush(&self, cx: &Ctx<'_>) -> Result<(), String> {
        log::info!(
            "no request left in flight; flushing {}",
            self.export.describe()
        );
        self.export.flush(cx).map_err(|e| e.to_string())
    }

    /// Writes `--stats`, if asked for.
    pub fn write_stats(
        &self,
        runtime: CounterSnapshot,
        queue: QueueStats,
        ops: &BTreeMap<String, OpReport>,
        per_queue: &[QueueStats],
    ) {
        if let Some(path) = &self.args.stats {
            let served = (runtime, queue, (self.report)());
            write_stats(path, &self.name, &self.dispatch, served, ops, per_queue);
        }
    }
}

/// How a serving loop ended.
pub struct Served {
    pub result: Result<(), String>,
    pub runtime: CounterSnapshot,
    pub queue: QueueStats,
    pub ops: BTreeMap<String, OpReport>,
    pub per_queue: Vec<QueueStats>,
}

impl Served {
    /// A loop that could not start.
    pub fn failed(message: String) -> Served {
        Served {
            result: Err(message),
            runtime: CounterSnapshot::default(),
            queue: QueueStats::default(),
            ops: BTreeMap::new(),
            per_queue: Vec::new(),
        }
    }
}

pub fn run(args: &Args) -> Result<(), String> {
    if args.growable && !args.writable {
        return Err("--growable needs --writable (-w)".into());
    }
    check_serve_args(&args.serve)?;
    let options = OpenOptions {
        writable: args.writable,
        direct: args.direct,
        lock: !args.no_lock,
        format: args.format.unwrap_or_default(),
    };
    let disk = backend::open(&args.image, &options).map_err(|e| open_error(&e))?;
    // `--inject`: the rules wrap the backend; "exporting ..." below lists them.
    let disk = match args.inject.clone() {
        Some(spec) => Arc::new(backend::InjectBackend::new(disk, spec)),
        None => disk,
    };
    if args.passthrough && disk.passthrough_file().is_none() {
        return Err(format!(
            "--passthrough needs a raw image file whose bytes are the exported ones, not {}",
            disk.describe()
        ));
    }
    let export = Arc::new(Export::new(
        Arc::clone(&disk),
        ExportOptions {
            writable: args.writable,
            growable: args.growable,
            allow_other: args.serve.allow_other,
            passthrough: args.passthrough,
        },
    ));
    let counted = Arc::clone(&export);
    let report: ReportFn = Box::new(move || BackendReport {
        backend: Some(disk.stats()),
        inject: disk.inject_stats(),
        dir: None,
        passthrough: counted.passthrough_stats(),
    });
    let target = Target {
        mountpoint: &args.mountpoint,
        name: &args.image,
        directory: false,
        read_only: false,
    };
    serve_mounted(&args.serve, &target, export, report)
}

/// The option combinations refused before anything is opened.
pub fn check_serve_args(args: &ServeArgs) -> Result<(), String> {
    if args.transport == "uring" && args.dispatch != Dispatch::Coroutine {
        return Err(format!(
            "--transport uring needs --dispatch coroutine (not {})",
            args.dispatch
        ));
    }
    if let (Dispatch::Threads(n), Some(2..)) = (args.dispatch, args.queues) {
        return Err(format!(
            "--queues is for coroutine and inline dispatch; threads:{n} serves {n} queues already"
        ));
    }
    Ok(())
}

/// Where and as what a file system is mounted.
pub struct Target<'a> {
    pub mountpoint: &'a Path,
    /// The image or source directory, as /proc/mounts and `--stats` show it.
    pub name: &'a str,
    /// A directory root over a directory (else a regular file over a regular file).
    pub directory: bool,
    /// Mount read-only (MS_RDONLY).
    pub read_only: bool,
}

/// Mounts `fs` on `target`, answers INIT, writes the pidfile, serves as `args` say until
/// SIGINT/SIGTERM or the unmount, then unmounts and writes `--stats`: the life of every
/// corofuse export.
pub fn serve_mounted<F: FileSystem>(
    args: &ServeArgs,
    target: &Target<'_>,
    fs: Arc<F>,
    report: ReportFn,
) -> Result<(), String> {
    let (queues, cpus) = plan_loops(args);
    let uring = match args.transport.as_str() {
        "dev" => false,
        "uring" => {
            uring_switch()
                .map_err(|off| format!("--transport uring: {off}, or use --transport dev"))?;
            true
        }
        _ => match (args.dispatch, uring_switch()) {
            (Dispatch::Coroutine, Ok(())) => true,
            (Dispatch::Coroutine, Err(off)) => {
                log::warn!("--transport auto: {off}; serving through /dev/fuse");
                false
            }
            _ => false,
        },
    };
    let signals = SignalFd::new().map_err(|e| format!("signalfd: {e}"))?;
    let init = fs.init_config(InitConfig {
        max_background: 256,
        congestion_threshold: 192,
        io_uring: uring,
        ..InitConfig::new().with_system_limits()
    });
    let mount_options = MountOptions {
        fsname: target.name.to_string(),
        allow_other: args.allow_other,
        max_read: Some(init.max_write),
        directory: target.directory,
        read_only: target.read_only,
        ..MountOptions::default()
    };
    let (session, mount) =
        fuse::mount::mount(target.mountpoint, &mount_options).map_err(|e| e.to_string())?;
    let negotiated = handshake(&session, &init).map_err(|e| format!("FUSE handshake: {e}"))?;
    fs.session_started(&negotiated, std::os::fd::AsFd::as_fd(&session));
    let uring = uring && negotiated.has(fuse::abi::FUSE_OVER_IO_URING);
    if args.transport == "uring" && !uring {
        return Err(format!(
            "--transport uring: the kernel (FUSE 7.{}) did not offer FUSE over io_uring; use --transport dev",
            negotiated.kernel_minor
        ));
    }
    if args.transport == "auto" && !uring && init.io_uring {
        log::warn!(
            "--transport auto: the kernel (FUSE 7.{}) did not offer FUSE over io_uring; serving through /dev/fuse",
            negotiated.kernel_minor
        );
    }
    let dispatch = describe_dispatch(args, queues, uring);
    log::info!(
        "exporting {} on {} ({} dispatch)",
        fs.describe(),
        mount.path().display(),
        dispatch
    );
    if let Some(path) = &args.pidfile {
        crate::out_file::replace(path, format!("{}\n", std::process::id()).as_bytes())
            .map_err(|e| format!("cannot write pidfile {}: {e}", path.display()))?;
    }
    let serving = Serving {
        args: args.clone(),
        export: fs,
        name: target.name.to_string(),
        report,
        session,
        max_write: negotiated.max_write,
        signals,
        uring,
        queues,
        cpus,
        dispatch,
    };
    let served = match args.dispatch {
        Dispatch::Coroutine | Dispatch::Inline => serve_loop::serve(&serving),
        Dispatch::Threads(n) => serve_threads::serve(&serving, n),
    };
    let unmounted = mount.unmount();
    serving.write_stats(served.runtime, served.queue, &served.ops, &served.per_queue);
    served.result?;
    if served.queue.stream_errors > 0 {
        return Err(format!(
            "the request stream from /dev/fuse failed ({} failed reads, see above); unmounted",
            served.queue.stream_errors
        ));
    }
    let shown = target.mountpoint.display();
    unmounted.map_err(|e| format!("unmount {shown}: {e}"))?;
    log::info!("unmounted {shown}");
    Ok(())
}

/// The one line for an image that would not open, with the way out of a lock conflict.
fn parse_format(s: &str) -> Result<Format, String> {
    match s {
        "raw" => Ok(Format::Raw),
        "qcow2" => Ok(Format::Qcow2),
        _ => Err(format!("unknown format {s:?} (raw or qcow2)")),
    }
}

fn open_error(e: &std::io::Error) -> String {
    let lock = e
        .get_ref()
        .and_then(|e| e.downcast_ref::<backend::LockError>());
    match lock {
        Some(lock) if lock.is_conflict() => format!("{e}; stop it or pass --no-lock"),
        Some(_) => format!("{e}; pass --no-lock to export it without locks"),
        None => e.to_string(),
    }
}

fn write_stats(
    path: &Path,
    image: &str,
    dispatch: &str,
    (runtime, queue, report): (CounterSnapshot, QueueStats, BackendReport),
    ops: &BTreeMap<String, OpReport>,
    per_queue: &[QueueStats],
) {
    // Counted before this snapshot's own copies below.
    let allocations = crate::alloc_count::allocations();
    let stats = daemon_stats::Stats {
        image: image.to_string(),
        dispatch: dispatch.to_string(),
        runtime,
        queue,
        backend: report.backend,
        inject: report.inject,
        dir: report.dir,
        passthrough: report.passthrough,
        allocations,
        ops: ops.clone(),
        per_queue: per_queue.to_vec(),
    };
    if let Err(e) = crate::out_file::replace(path, stats.to_json().as_bytes()) {
        log::error!("cannot write stats to {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: Args,
    }

    fn loops(args: &[&str], allowed: &[usize]) -> (usize, Vec<usize>) {
        let argv = ["mount", "null:1M", "/mnt"].iter().chain(args);
        let cli = Cli::try_parse_from(argv).expect("parses");
        plan_loops_on(&cli.mount.serve, allowed.to_vec())
    }

    #[test]
    fn several_loops_are_pinned_one_per_allowed_cpu() {
        assert_eq!(loops(&[], &[0, 1]), (2, vec![0, 1]), "the default");
        assert_eq!(loops(&["--queues", "2"], &[2, 5, 7]), (2, vec![2, 5]));
        assert_eq!(
            loops(&["--queues", "4"], &[0, 1]),
            (4, vec![0, 1]),
            "loop i on cpus[i % 2]"
        );
        assert_eq!(
            loops(&["--queues", "1"], &[0, 1]),
            (1, vec![]),
            "one loop floats"
        );
        assert_eq!(loops(&[], &[3]), (1, vec![]));
        assert_eq!(
            loops(&["--queues", "2", "--cpus", "1,1"], &[0, 1]),
            (2, vec![1, 1])
        );
        assert_eq!(loops(&["--dispatch", "inline"], &[0, 1]), (1, vec![]));
        let many: Vec<usize> = (0..16).collect();
        assert_eq!(loops(&[], &many).0, MAX_DEFAULT_QUEUES);
    }
}
