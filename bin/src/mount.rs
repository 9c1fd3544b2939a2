//! `corofuse mount`: export an image over a regular file until SIGINT/SIGTERM or unmount.
//!
//! `corofuse mount IMAGE MNT` is shorthand for one block node and one export of it in
//! the model the storage daemon builds too ([`crate::model`]): the image is the node
//! ([`node_of`]: its spec the protocol layer, `--format` the format layer, the image
//! options), the mount point and serving options the export, on loops of its own. What
//! is left here is the command line, its checks and its wording.
//!
//! Order of events: open the image (taking QEMU's image locks unless `--no-lock`), mount,
//! answer INIT, serve, write the pidfile. On SIGINT/SIGTERM: stop taking requests, let
//! those in flight finish, flush the image, unmount, exit 0. SIGUSR1 writes the
//! statistics without stopping ([`crate::foreground`]). Every setup error is one line on
//! stderr and a non-zero exit status.

use std::path::PathBuf;
use std::time::Duration;

use backend::Format;
use server::{Dispatch, LoopSet, ServeOptions};

use crate::foreground::{Foreground, ReportFn};
use crate::model::{self, ExportError, ExportSpec, Model, Node};
use crate::serve_args::ServeArgs;
use crate::signals::SignalFd;

#[derive(clap::Args, Clone, Debug)]
#[command(after_help = "Examples:
  corofuse mount -w --format raw disk.img disk.img        # over the image itself
  corofuse mount -w --format qcow2 vm.qcow2 /tmp/vm.raw    # a qcow2 disk as raw bytes
  corofuse mount -w 'nbd+unix:///disk?socket=/tmp/nbd.sock' /tmp/disk.raw
SIGTERM, SIGINT, SIGHUP or an unmount end it (requests finish, the image is flushed).")]
pub struct Args {
    /// An image file (raw or qcow2), null:SIZE (e.g. null:1G), or an NBD export:
    /// nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH
    image: String,
    /// An existing regular file (it may be the image itself)
    mountpoint: PathBuf,
    /// Allow writes (default: read-only, as in QEMU)
    #[arg(short = 'w', long, help_heading = "Image")]
    writable: bool,
    /// Writes and truncation past the end resize the image
    #[arg(long, help_heading = "Image")]
    growable: bool,
    /// Open the image with O_DIRECT
    #[arg(long, help_heading = "Image")]
    direct: bool,
    /// The image's format: `raw` or `qcow2`; give it. Without it the format is probed
    /// (qcow2 if the file starts with the qcow2 magic, else raw) with QEMU's safeguards: a
    /// warning, writes that would make a raw image's first sector probe as another format
    /// refused (EPERM), a probed qcow2 image's backing file not followed
    #[arg(long, value_name = "FORMAT", value_parser = parse_format, help_heading = "Image")]
    format: Option<Format>,
    /// Export an internal snapshot of a qcow2 image, by its ID or else its name (as
    /// `qemu-img snapshot -l` lists them), read-only (`qemu-nbd -l`). Without it, the
    /// image's active state is exported; with -w, writes to clusters that snapshots share
    /// copy them first, so the snapshots stay as they are
    #[arg(short = 'l', long, value_name = "ID|NAME", help_heading = "Image")]
    snapshot: Option<String>,
    /// FUSE passthrough for a raw image file (Linux 6.9+, root): opens that only read go
    /// straight to the image file, at the device's speed; writable opens are served as
    /// without it (the size stays exact), their mappings passed through. Not for qcow2,
    /// null or --inject. Where the kernel lacks it: one log line, and the normal path
    #[arg(long, help_heading = "Image")]
    passthrough: bool,
    /// Take no image locks (QEMU's locking=off). By default the image gets QEMU's lock
    /// bytes: a writable export keeps QEMU's writers (and other writable exports) out and
    /// is refused where one is in; a read-only export takes what a QEMU reader takes
    #[arg(long, help_heading = "Image")]
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
    #[arg(long, value_name = "SPEC", value_parser = backend::inject::parse, verbatim_doc_comment, help_heading = "Diagnostics")]
    inject: Option<backend::inject::Spec>,
    /// Record every write, discard, write_zeroes, resize and flush that reaches the image
    /// (for qcow2: the image file under the qcow2 layer, and what the qcow2 layer is
    /// asked), with the data, in PATH, for `corofuse crash-check`. Off by default
    #[arg(long, value_name = "PATH")]
    record_writes: Option<PathBuf>,
    /// Most bytes the write log may hold; past it image writes fail with ENOSPC (one
    /// error line)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = backend::parse_size, requires = "record_writes")]
    record_writes_max: u64,
    /// Connections to an NBD server that advertises CAN_MULTI_CONN (one otherwise).
    /// Default: one per event loop (one loop for NBD unless --queues) or worker thread
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64), help_heading = "NBD and TLS")]
    nbd_connections: Option<u16>,
    /// Requests in flight on one NBD connection at most (more wait for a free slot)
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=4096), help_heading = "NBD and TLS")]
    nbd_in_flight: u16,
    /// When the NBD server goes away, requests wait up to S seconds while the connection
    /// is made again (the handshake redone, the export's size checked), and those in
    /// flight are sent again; then they fail with EIO. 0 (default): they fail at once.
    /// Either way each later request tries a new connection first, so a server that
    /// comes back is used again without a remount (as QEMU's nbd driver)
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        help_heading = "NBD and TLS"
    )]
    reconnect_delay: u32,
    /// While the NBD server is not there yet at mount (connection refused, no socket
    /// file), try again for up to S seconds (QEMU's open-timer). 0 (default): fail at once
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        help_heading = "NBD and TLS"
    )]
    open_timer: u32,
    /// TLS to the NBD server (as QEMU's tls-creds-x509): DIR holds ca-cert.pem, ca-crl.pem
    /// if there, and client-cert.pem and client-key.pem if the server wants a client
    /// certificate. Turns TLS on for nbd:// URIs too; nbds:// and nbds+unix:// need it
    #[arg(long, value_name = "DIR", help_heading = "NBD and TLS")]
    tls_creds: Option<PathBuf>,
    /// The name the NBD server's certificate must carry (default: the URI's host; over a
    /// unix socket none is checked unless given, as QEMU)
    #[arg(
        long,
        value_name = "NAME",
        requires = "tls_creds",
        help_heading = "NBD and TLS"
    )]
    tls_hostname: Option<String>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// How the mount is served: as the options say, except that an NBD image gets one event
/// loop unless `--queues` says otherwise. The storage work is the server's there, and a
/// loop spends ~10-15 us per request on the client side (one carries ~70k IOPS); a second
/// loop pinned to the other CPU, on a machine where the server and the load also run,
/// made reads at iodepth 1 0.63-0.76x of one loop's at 1.5-2.5x its CPU per request, and
/// gained nothing elsewhere (benches/HISTORY.md, "NBD client: one loop", its `--queues 1,2`
/// table).
fn serve_args(args: &Args) -> ServeArgs {
    let mut serve = args.serve.clone();
    if backend::nbd::is_nbd(&args.image) && serve.queues.is_none() {
        serve.queues = Some(1);
    }
    serve
}

/// The one node `corofuse mount IMAGE` is shorthand for: the image spec its protocol
/// layer, `--format` its format layer (probed without), and the image options.
pub(crate) fn node_of(args: &Args) -> Node {
    let nbd = backend::nbd::is_nbd(&args.image).then(|| nbd_options(args));
    Node {
        format: args.format.unwrap_or_default(),
        direct: args.direct,
        lock: !args.no_lock,
        snapshot: args.snapshot.clone(),
        nbd: nbd.unwrap_or_default(),
        record: (args.record_writes.clone()).map(|path| (path, args.record_writes_max)),
        inject: args.inject.clone(),
        ..Node::new(&args.image)
    }
}

/// How an NBD image connects: one connection per loop or worker thread unless
/// `--nbd-connections` says.
fn nbd_options(args: &Args) -> backend::NbdOptions {
    let serve = serve_args(args).options();
    let connections = match (args.nbd_connections, serve.dispatch) {
        (Some(n), _) => usize::from(n),
        (None, Dispatch::Threads(n)) => n,
        (None, _) => {
            let allowed = runtime::affinity::allowed_cpus().unwrap_or_else(|_| vec![0]);
            serve.plan_loops(allowed).0
        }
    };
    backend::NbdOptions {
        connections,
        max_in_flight: usize::from(args.nbd_in_flight),
        reconnect_delay: Duration::from_secs(u64::from(args.reconnect_delay)),
        open_timer: Duration::from_secs(u64::from(args.open_timer)),
        tls: args
            .tls_creds
            .as_ref()
            .map(|creds| backend::nbd::TlsOptions {
                creds: creds.clone(),
                hostname: args.tls_hostname.clone(),
            }),
    }
}

/// The one export of that node `corofuse mount IMAGE MNT` is shorthand for, on loops of
/// its own.
fn export_of(args: &Args, serve: ServeOptions) -> ExportSpec {
    ExportSpec {
        id: EXPORT.into(),
        node: NODE.into(),
        mountpoint: args.mountpoint.clone(),
        name: args.image.clone(),
        writable: args.writable,
        growable: args.growable,
        passthrough: args.passthrough,
        serve,
        loops: None,
    }
}

/// The names of `corofuse mount`'s node and export in its model.
const NODE: &str = "image";
const EXPORT: &str = "mount";

pub fn run(args: &Args) -> Result<(), String> {
    // Before any thread starts (the backend and the export may start some), so that every
    // thread inherits the blocked signals.
    let signals = SignalFd::new().map_err(|e| format!("signalfd: {e}"))?;
    if args.growable && !args.writable {
        return Err("--growable needs --writable (-w)".into());
    }
    if args.snapshot.is_some() && args.writable {
        return Err("--snapshot exports the snapshot read-only: drop --writable (-w)".into());
    }
    args.serve.check()?;
    if args.passthrough && args.writable && args.format.is_none() && !is_special(&args.image) {
        return Err(
            "--passthrough with -w needs --format raw: without it the format is \
                    probed, and writes to the image's first sector are checked so that it \
                    never probes as another format, which mappings passed through to the file \
                    would skip"
                .into(),
        );
    }
    let serve = serve_args(args);
    let mut model = Model::new(LoopSet::new());
    model.add_node(NODE, node_of(args))?;
    let export = model
        .add_export(&export_of(args, serve.options()))
        .map_err(|e| match e {
            ExportError::Open(e) => open_error(&e),
            ExportError::Refused(e) => e,
        })?;
    let report: ReportFn = Box::new(move || model::sections(&export));
    let served = model.export(EXPORT).expect("the export just added");
    let life = Foreground::new(&serve, &args.image, served, report);
    life.serve(signals, || model.remove_export(EXPORT))
}

/// Whether the image spec names no file whose format is probed (null, NBD).
fn is_special(image: &str) -> bool {
    image.starts_with("null:") || backend::nbd::is_nbd(image)
}

fn parse_format(s: &str) -> Result<Format, String> {
    match s {
        "raw" => Ok(Format::Raw),
        "qcow2" => Ok(Format::Qcow2),
        _ => Err(format!("unknown format {s:?} (raw or qcow2)")),
    }
}

/// The one line for an image that would not open, with the way out of a lock conflict.
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use server::{LoopPlacement, Transport};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: Args,
    }

    fn options(args: &[&str]) -> ServeOptions {
        let argv = ["mount", "null:1M", "/mnt"].iter().chain(args);
        let cli = Cli::try_parse_from(argv).expect("parses");
        cli.mount.serve.options()
    }

    #[test]
    fn the_command_line_becomes_the_serving_options() {
        let o = options(&[]);
        assert_eq!(
            (o.dispatch, o.queues, o.transport, o.placement, o.readers),
            (
                Dispatch::Coroutine,
                None,
                Transport::Dev,
                LoopPlacement::Adaptive,
                2
            )
        );
        assert!(!o.accounting && !o.allow_other);
        let o = options(&[
            "--queues",
            "2",
            "--cpus",
            "1,1",
            "--transport",
            "uring",
            "--placement",
            "all",
            "--stats",
            "/tmp/s.json",
            "--dispatch",
            "threads:3",
            "--allow-other",
        ]);
        assert_eq!(o.queues, Some(2));
        assert_eq!(o.cpus, Some(vec![1, 1]));
        assert_eq!(
            (o.transport, o.placement),
            (Transport::Uring, LoopPlacement::All)
        );
        assert_eq!(o.dispatch, Dispatch::Threads(3));
        assert!(o.accounting && o.allow_other, "--stats turns accounting on");
        assert!(
            o.check().is_err(),
            "threads with --queues 2 and uring are refused"
        );
    }

    #[test]
    fn help_is_grouped_by_topic_with_examples() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        let at = |heading: &str| help.find(heading).unwrap_or_else(|| panic!("{heading}"));
        assert!(at("Image:") < at("--format"), "{help}");
        assert!(at("NBD and TLS:") < at("--reconnect-delay"), "{help}");
        assert!(at("Serving:") < at("    --queues <"), "{help}");
        assert!(at("Diagnostics:") < at("--stats"), "{help}");
        assert!(
            help.contains("Examples:\n  corofuse mount -w --format raw"),
            "{help}"
        );
    }

    #[test]
    fn an_nbd_image_gets_one_loop_unless_queues_says_otherwise() {
        let queues = |argv: &[&str]| {
            let cli = Cli::try_parse_from(argv).expect("parses");
            serve_args(&cli.mount).queues
        };
        let nbd = "nbd+unix:///?socket=/run/s";
        assert_eq!(queues(&["mount", nbd, "/mnt"]), Some(1));
        assert_eq!(queues(&["mount", "nbd://h/e", "/mnt"]), Some(1));
        assert_eq!(queues(&["mount", nbd, "/mnt", "--queues", "2"]), Some(2));
        assert_eq!(queues(&["mount", "null:1M", "/mnt"]), None, "one per CPU");
    }
}
