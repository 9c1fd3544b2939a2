//! Serving on coroutine event loops (`--dispatch coroutine` and `inline`), `--queues N` of
//! them.
//!
//! Each loop is a thread of its own with its own runtime (ring, coroutine and buffer pools,
//! counters) and its own clone of the session's /dev/fuse fd (`FUSE_DEV_IOC_CLONE`): the
//! clones share the kernel's input queue, a request goes to whichever loop reads it first,
//! and its reply goes back on the fd it came from. The export (and so the backend, with its
//! size and range locks) is shared by all of them.
//!
//! The main thread owns the signals. SIGINT/SIGTERM set every loop's stop flag and kick its
//! eventfd, which a control coroutine of that loop reads through the loop's ring: the loop
//! stops taking requests, those in flight finish. SIGUSR1 asks every loop for a snapshot
//! the same way, merges them and writes `--stats`. When every loop has ended (stopped, or
//! the file system was unmounted: each queue then sees ENODEV), the main thread flushes
//! the image once and merges the loops' final counters.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use backend::Ctx;
use fuse::dev::FuseDev;
use image_export::Export;
use runtime::{Co, Config, CounterSnapshot, Runtime};
use transport::accounting::Accounting;
use transport::{FileSystem, Queue, QueueConfig, QueueStats};

use crate::mount::{Served, Serving};
use crate::serve_threads::wait_signal;

/// What one loop reports: on request (SIGUSR1) and when it ends.
struct LoopReport {
    index: usize,
    runtime: CounterSnapshot,
    queue: QueueStats,
    accounting: Accounting,
}

/// How the main thread reaches one loop.
struct Control {
    /// Kicked (a write of 1) after setting a flag. Non-blocking: the loop waits for it with
    /// a poll SQE and then drains it with read(2), so no io_uring worker thread blocks on it.
    kick: OwnedFd,
    stop: AtomicBool,
    snapshot: AtomicBool,
}

impl Control {
    fn new() -> io::Result<Control> {
        // SAFETY: eventfd(2) with valid flags; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Control {
            // SAFETY: a fresh descriptor that nothing else owns.
            kick: unsafe { OwnedFd::from_raw_fd(fd) },
            stop: AtomicBool::new(false),
            snapshot: AtomicBool::new(false),
        })
    }

    /// Raises `flag` and wakes the loop.
    fn send(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::SeqCst);
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        let n = unsafe { libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), 8) };
        if n != 8 {
            log::warn!("kicking a loop: {}", io::Error::last_os_error());
        }
    }
}

/// Everything a loop thread needs.
struct LoopSetup {
    index: usize,
    dev: FuseDev,
    export: Arc<Export>,
    max_write: u32,
    queue: QueueConfig,
    runtime: Config,
    cpu: Option<usize>,
    control: Arc<Control>,
    snapshots: Sender<LoopReport>,
}

pub fn serve(serving: Serving, queues: usize) -> Served {
    let (snapshots, reports) = mpsc::channel();
    let mut loops = Vec::with_capacity(queues);
    for index in 0..queues {
        match start_loop(&serving, index, snapshots.clone()) {
            Ok(started) => loops.push(started),
            Err(e) => {
                stop_all(&loops);
                let _ = finish(loops);
                return Served::failed(format!("starting event loop {index}: {e}"));
            }
        }
    }
    drop(snapshots);
    while !loops.iter().all(|(handle, _)| handle.is_finished()) {
        match wait_signal(&serving.signals, 100) {
            Some(libc::SIGUSR1) => {
                let (merged, per_queue) = snapshot(&loops, &reports);
                let ops = merged.accounting.report();
                serving.write_stats(merged.runtime, merged.queue, &ops, &per_queue);
            }
            Some(signo) => {
                log::info!("signal {signo}: finishing the requests in flight, then unmounting");
                stop_all(&loops);
                break;
            }
            None => {}
        }
    }
    let (result, merged, per_queue) = finish(loops);
    let fs = &serving.export;
    log::info!("no request left in flight; flushing {}", fs.describe());
    let flushed = fs.flush(&Ctx::Blocking).map_err(|e| e.to_string());
    Served {
        result: result.and(flushed),
        runtime: merged.runtime,
        queue: merged.queue,
        ops: merged.accounting.report(),
        per_queue,
    }
}

type Started = (JoinHandle<Result<LoopReport, String>>, Arc<Control>);

fn start_loop(
    serving: &Serving,
    index: usize,
    snapshots: Sender<LoopReport>,
) -> io::Result<Started> {
    let control = Arc::new(Control::new()?);
    let dev = serving
        .session
        .clone_queue(true)
        .map_err(|e| io::Error::new(e.kind(), format!("cloning the /dev/fuse queue: {e}")))?;
    let cpus = serving.cpus();
    let setup = LoopSetup {
        index,
        dev,
        export: Arc::clone(&serving.export),
        max_write: serving.max_write,
        queue: serving.queue_config(),
        runtime: Config {
            poll_ns: serving.poll_ns(),
            account: serving.accounting(),
            ..Config::default()
        },
        cpu: (!cpus.is_empty()).then(|| cpus[index % cpus.len()]),
        control: Arc::clone(&control),
        snapshots,
    };
    let handle = std::thread::Builder::new()
        .name(format!("fuse-loop-{index}"))
        .spawn(move || run_loop(setup))?;
    Ok((handle, control))
}

fn stop_all(loops: &[Started]) {
    for (_, control) in loops {
        control.send(&control.stop);
    }
}

/// Every loop's snapshot, merged, and each loop's queue statistics; a loop that does not
/// answer within a second is left out.
fn snapshot(loops: &[Started], reports: &Receiver<LoopReport>) -> (LoopReport, Vec<QueueStats>) {
    for (_, control) in loops {
        control.send(&control.snapshot);
    }
    let mut got = Vec::with_capacity(loops.len());
    for _ in loops {
        match reports.recv_timeout(Duration::from_secs(1)) {
            Ok(report) => got.push(report),
            Err(_) => {
                log::warn!("a loop did not answer the statistics request");
                break;
            }
        }
    }
    merge(got)
}

/// Joins every loop: the first error, the merged final reports, each loop's queue stats.
fn finish(loops: Vec<Started>) -> (Result<(), String>, LoopReport, Vec<QueueStats>) {
    let mut got = Vec::with_capacity(loops.len());
    let mut result = Ok(());
    for (handle, _) in loops {
        match handle.join() {
            Ok(Ok(report)) => got.push(report),
            Ok(Err(e)) => result = result.and(Err(e)),
            Err(_) => result = result.and(Err("an event loop thread panicked".to_string())),
        }
    }
    let (merged, per_queue) = merge(got);
    (result, merged, per_queue)
}

/// The sum of `reports`, and their queue statistics in loop order.
fn merge(mut reports: Vec<LoopReport>) -> (LoopReport, Vec<QueueStats>) {
    reports.sort_by_key(|r| r.index);
    let mut merged = LoopReport::empty();
    for report in &reports {
        merged.add(report);
    }
    (merged, reports.iter().map(|r| r.queue).collect())
}

impl LoopReport {
    fn empty() -> LoopReport {
        LoopReport {
            index: 0,
            runtime: CounterSnapshot::default(),
            queue: QueueStats::default(),
            accounting: Accounting::default(),
        }
    }

    fn add(&mut self, other: &LoopReport) {
        self.runtime.add(&other.runtime);
        self.queue.add(&other.queue);
        self.accounting.merge(&other.accounting);
    }

    fn of(index: usize, co: &Co<'_>, queue: &Queue<Export>) -> LoopReport {
        LoopReport {
            index,
            runtime: co.counters(),
            queue: queue.stats(),
            accounting: queue.accounting_copy(),
        }
    }
}

/// One loop thread: serve until stopped or unmounted, then report.
fn run_loop(setup: LoopSetup) -> Result<LoopReport, String> {
    let index = setup.index;
    if let Some(cpu) = setup.cpu {
        crate::bench::pin_thread(cpu)
            .map_err(|e| format!("loop {index}: pinning to CPU {cpu}: {e}"))?;
    }
    let rt = Runtime::new(setup.runtime).map_err(|e| format!("loop {index}: {e}"))?;
    let queue = Queue::new(setup.dev, setup.export, setup.max_write, setup.queue);
    let (control, snapshots) = (setup.control, setup.snapshots);
    let q = Rc::clone(&queue);
    let report = rt
        .block_on(move |co| -> io::Result<LoopReport> {
            q.start(co)?;
            let watcher = {
                let q = Rc::clone(&q);
                co.spawn_named("control", move |co| {
                    watch_control(co, index, &q, &control, &snapshots)
                })?
            };
            q.wait_finished(co);
            co.cancel_io(watcher)?;
            Ok(LoopReport::of(index, co, &q))
        })
        .map_err(|e| format!("loop {index}: {e}"))?
        .map_err(|e| format!("loop {index}: {e}"))?;
    // The control coroutine may still be finishing its cancelled read: count it too.
    Ok(LoopReport {
        runtime: rt.counters(),
        ..report
    })
}

/// Reads kicks from the main thread: a snapshot request, or stop.
fn watch_control(
    co: &Co<'_>,
    index: usize,
    queue: &Queue<Export>,
    control: &Control,
    snapshots: &Sender<LoopReport>,
) {
    let mut count = [0u8; 8];
    loop {
        match co.poll(&control.kick.as_fd(), libc::POLLIN) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => {
                log::error!("waiting on the loop's control eventfd: {e}");
                return;
            }
        }
        // SAFETY: reads at most 8 bytes into a live 8-byte buffer from an eventfd we own;
        // EAGAIN (already drained) is harmless.
        unsafe { libc::read(control.kick.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        if control.snapshot.swap(false, Ordering::SeqCst) {
            let _ = snapshots.send(LoopReport::of(index, co, queue));
        }
        if control.stop.load(Ordering::SeqCst) {
            queue.stop(co);
            return;
        }
    }
}
