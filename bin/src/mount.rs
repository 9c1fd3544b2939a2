//! `corofuse mount`: export an image over a regular file until SIGINT/SIGTERM or unmount.
//!
//! Order of events: open the image, mount, answer INIT, write the pidfile, serve. On
//! SIGINT/SIGTERM: stop taking requests, let those in flight finish, flush the image,
//! unmount, exit 0. SIGUSR1 writes the statistics without stopping. Every setup error is
//! one line on stderr and a non-zero exit status.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use backend::{BlockBackend, Ctx, OpenOptions};
use fuse::export::{Export, ExportOptions};
use fuse::init::InitConfig;
use fuse::mount::MountOptions;
use fuse::server::{handshake, Queue, QueueConfig, QueueStats};
use runtime::{Co, Config, CounterSnapshot, Runtime};
use serde::Serialize;

use crate::signals::SignalFd;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A raw image file, or null:SIZE (e.g. null:1G)
    image: String,
    /// An existing regular file (it may be the image itself)
    mountpoint: PathBuf,
    /// Allow writes (default: read-only, as in QEMU)
    #[arg(short = 'w', long)]
    writable: bool,
    /// Writes and truncation past the end resize the image
    #[arg(long)]
    growable: bool,
    /// Other users may access the mount
    #[arg(long)]
    allow_other: bool,
    /// Open the image with O_DIRECT
    #[arg(long)]
    direct: bool,
    /// Written once the mount is live
    #[arg(long, value_name = "PATH")]
    pidfile: Option<PathBuf>,
    /// Write the runtime's counters as JSON at exit and on SIGUSR1
    #[arg(long, value_name = "PATH")]
    stats: Option<PathBuf>,
    /// Reads of /dev/fuse kept outstanding
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    readers: u16,
    /// Send replies through io_uring instead of writev(2)
    #[arg(long)]
    ring_replies: bool,
    /// Spin up to this long for the next request before sleeping (0: never). The window
    /// adapts (QEMU's poll-max-ns): it grows while requests come quickly and drops to 0
    /// after a long idle wait, so an idle export burns no CPU
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    poll_us: u64,
}

/// What `--stats` writes.
#[derive(Serialize)]
struct Stats<'a> {
    image: &'a str,
    runtime: CounterSnapshot,
    queue: QueueStats,
}

pub fn run(args: &Args) -> Result<(), String> {
    if args.growable && !args.writable {
        return Err("--growable needs --writable (-w)".into());
    }
    let options = OpenOptions {
        writable: args.writable,
        direct: args.direct,
    };
    let disk = backend::open(&args.image, &options).map_err(|e| e.to_string())?;
    let export = Arc::new(Export::new(
        Arc::clone(&disk),
        ExportOptions {
            writable: args.writable,
            growable: args.growable,
            allow_other: args.allow_other,
        },
    ));
    let signals = SignalFd::new().map_err(|e| format!("signalfd: {e}"))?;
    let init = InitConfig {
        max_background: 256,
        congestion_threshold: 192,
        ..InitConfig::new().with_system_limits()
    };
    let mount_options = MountOptions {
        fsname: args.image.clone(),
        allow_other: args.allow_other,
        max_read: Some(init.max_write),
        ..MountOptions::default()
    };
    let (session, mount) =
        fuse::mount::mount(&args.mountpoint, &mount_options).map_err(|e| e.to_string())?;
    let negotiated = handshake(&session, &init).map_err(|e| format!("FUSE handshake: {e}"))?;
    log::info!(
        "exporting {} on {}",
        disk.describe(),
        mount.path().display()
    );
    if let Some(path) = &args.pidfile {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot write pidfile {}: {e}", path.display()))?;
    }
    let queue_fd = session
        .clone_queue(true)
        .map_err(|e| format!("cloning the /dev/fuse queue: {e}"))?;
    let config = QueueConfig {
        readers: args.readers as usize,
        ring_replies: args.ring_replies,
    };
    let queue = Queue::new(queue_fd, export, negotiated.max_write, config);
    let rt = Runtime::new(Config {
        poll_ns: args.poll_us * 1000,
        ..Config::default()
    })
    .map_err(|e| e.to_string())?;
    let stats_path = args.stats.clone();
    let image = args.image.clone();
    let q = Rc::clone(&queue);
    let served =
        rt.block_on(move |co| serve(co, &q, signals, &disk, &image, stats_path.as_deref()));
    let unmounted = mount.unmount();
    if let Some(path) = &args.stats {
        write_stats(path, &args.image, rt.counters(), queue.stats());
    }
    served
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    unmounted.map_err(|e| format!("unmount {}: {e}", args.mountpoint.display()))?;
    log::info!("unmounted {}", args.mountpoint.display());
    Ok(())
}

/// The main coroutine: serve until the queue ends, then flush.
fn serve(
    co: &Co<'_>,
    queue: &Rc<Queue>,
    signals: SignalFd,
    disk: &Arc<dyn BlockBackend>,
    image: &str,
    stats: Option<&Path>,
) -> io::Result<()> {
    queue.start(co)?;
    let watcher = {
        let (queue, image, stats) = (
            Rc::clone(queue),
            image.to_string(),
            stats.map(Path::to_path_buf),
        );
        co.spawn_named("signals", move |co| {
            watch_signals(co, &queue, &signals, &image, stats.as_deref())
        })?
    };
    queue.wait_finished(co);
    co.cancel_io(watcher)?;
    log::info!("no request left in flight; flushing {}", disk.describe());
    disk.flush(&Ctx::Coroutine(co))
}

/// Reads signals through the ring: SIGUSR1 writes the stats, SIGINT/SIGTERM stop the queue.
fn watch_signals(
    co: &Co<'_>,
    queue: &Queue,
    signals: &SignalFd,
    image: &str,
    stats: Option<&Path>,
) {
    let mut info = [0u8; 128];
    loop {
        match co.read(signals, &mut info) {
            Ok(128) => {}
            Ok(n) => log::warn!("short signalfd read of {n} bytes"),
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => {
                log::error!("reading signals: {e}");
                return;
            }
        }
        match SignalFd::signo(&info) {
            libc::SIGUSR1 => {
                if let Some(path) = stats {
                    write_stats(path, image, co.counters(), queue.stats());
                }
            }
            signo => {
                log::info!("signal {signo}: finishing the requests in flight, then unmounting");
                queue.stop(co);
                return;
            }
        }
    }
}

fn write_stats(path: &Path, image: &str, runtime: CounterSnapshot, queue: QueueStats) {
    let stats = Stats {
        image,
        runtime,
        queue,
    };
    let json = serde_json::to_string_pretty(&stats).expect("stats serialise");
    if let Err(e) = std::fs::write(path, json + "\n") {
        log::error!("cannot write stats to {}: {e}", path.display());
    }
}
