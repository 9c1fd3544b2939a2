//! Serving one session on coroutine event loops ([`Dispatch::Coroutine`](crate::Dispatch)
//! and `Inline`): the loops of a [`LoopSet`], the session's own or shared with other
//! sessions.
//!
//! On each loop it is given, the session has its own clone of the /dev/fuse fd
//! (`FUSE_DEV_IOC_CLONE`) served by a [`Queue`] of that loop (with its own buffers,
//! stats and accounting): the clones share the kernel's input queue, a request goes to
//! whichever loop reads it first, and its reply goes back on the fd it came from. The
//! export (and so the backend, with its size and range locks) is shared by all of them.
//!
//! The thread that called [`Server::serve`] supervises: it runs the loop placement's
//! trials and waits for the [`ServeHandle`](crate::ServeHandle)'s commands. A stop sets
//! the session's stop flag on every loop and kicks its eventfd, which a control coroutine
//! of the session on that loop reads through the loop's ring: the queue stops taking
//! requests, those in flight finish. A snapshot asks every loop for the session's
//! counters the same way and merges them. When the session's part on every loop has
//! ended (stopped, or the file system was unmounted: each queue then sees ENODEV), the
//! supervisor flushes the file system once and merges the final counters. The loops go
//! on serving their other sessions.

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fuse::dev::FuseDev;
use runtime::{Co, CounterSnapshot, EventFd};
use transport::accounting::Accounting;
use transport::placement::{Controller, ControllerStats, Placement};
use transport::uring::{possible_cpus, RingConfig, RingQueues};
use transport::FileSystem;
use transport::{Queue, QueueConfig, QueueStats};

use crate::control::{Command, Commands};
use crate::error::ServeError;
use crate::loop_class::ClassGuard;
use crate::loop_set::LoopSet;
use crate::server::{Report, Served, Server};

/// What one loop reports: on request (SIGUSR1) and when it ends.
struct LoopReport {
    index: usize,
    /// No request is being served: the /dev/fuse queue has finished (after a stop) and no
    /// ring entry holds a request.
    settled: bool,
    runtime: CounterSnapshot,
    queue: QueueStats,
    accounting: Accounting,
}

/// How the main thread reaches one loop.
struct Control {
    /// Kicked after setting a flag. The loop waits for it with a poll SQE and then drains
    /// it, so no io_uring worker thread blocks on it.
    kick: EventFd,
    stop: AtomicBool,
    snapshot: AtomicBool,
    /// Set by the loop once it has acted on `stop` (only that loop touches it).
    stopped: AtomicBool,
    /// Set by the loop when the session's part there ended with an error (its request
    /// stream failed): the main thread then stops the others.
    failed: AtomicBool,
    /// How the session's part on this loop ended, once it has.
    outcome: Mutex<Option<Result<LoopReport, ServeError>>>,
    /// The loop thread's id once it went into the idle class (`loop_class`), 0 if it did
    /// not, [`UNDECIDED`] before the loop decided.
    idle_tid: AtomicI32,
}

/// [`Control::idle_tid`] before the loop has started.
const UNDECIDED: i32 = -1;

impl Control {
    fn new() -> io::Result<Control> {
        Ok(Control {
            kick: EventFd::new()?,
            stop: AtomicBool::new(false),
            snapshot: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            outcome: Mutex::new(None),
            idle_tid: AtomicI32::new(UNDECIDED),
        })
    }

    /// Whether the session's part on this loop has ended.
    fn is_done(&self) -> bool {
        self.outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Raises `flag` and wakes the loop.
    fn send(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// Wakes the loop (which then also applies the placement's choice for it).
    fn kick(&self) {
        if let Err(e) = self.kick.signal() {
            log::warn!("kicking a loop: {e}");
        }
    }
}

/// Everything the session's part on one loop needs.
struct LoopSetup<F: FileSystem> {
    /// The loop's place among the session's loops (not in the set).
    index: usize,
    loops: usize,
    dev: FuseDev,
    /// With `--transport uring`: the fd the ring entries use, and their depth.
    ring: Option<(FuseDev, usize)>,
    export: Arc<F>,
    max_write: u32,
    queue: QueueConfig,
    /// Shared by the loops whose queues the placement pauses and resumes.
    placement: Option<Arc<Placement>>,
    control: Arc<Control>,
    snapshots: Sender<LoopReport>,
    /// Woken when this part of the session ends.
    supervisor: Arc<Commands>,
    /// Serve the ring from the idle scheduling class (`loop_class`).
    idle_class: bool,
}

/// Serves `server`'s session on the loops `on` of `set` until stopped or unmounted.
pub fn serve<F: FileSystem>(server: &Server<F>, set: &LoopSet, on: &[usize]) -> Served {
    let (snapshots, reports) = mpsc::channel();
    let mut loops = Vec::with_capacity(on.len());
    let placement = server
        .adaptive_placement(on.len())
        .then(|| Arc::new(Placement::new(on.len())));
    for (index, &at) in on.iter().enumerate() {
        match start_loop(
            server,
            set,
            (index, at),
            placement.clone(),
            snapshots.clone(),
        ) {
            Ok(started) => loops.push(started),
            Err(e) => {
                stop_all(&loops);
                let _ = finish(server, loops);
                return Served::failed(ServeError::StartLoop { at, source: e });
            }
        }
    }
    drop(snapshots);
    let mut placer = placement
        .as_deref()
        .map(|p| (p, Controller::new(p, Instant::now())));
    // The controller's counts, kept when it stops at the end of the session.
    let mut placed = None;
    let mut guard: Option<ClassGuard> = None;
    while !loops.iter().all(|c| c.is_done()) {
        let mut wait = Duration::from_millis(100);
        if server.uring {
            wait = wait.min(guard_loops(&mut guard, &loops));
        }
        if let Some((placement, controller)) = placer.as_mut() {
            if loops.iter().any(|c| c.is_done()) {
                // The session is ending (unmounted): a paused loop has no read to see
                // that with. Take every loop back, for good.
                placement.resume_all();
                kick_all(&loops);
                placed = Some(controller.stats());
                placer = None;
            } else {
                let next = controller.tick(placement, Instant::now());
                if next.changed {
                    kick_all(&loops);
                }
                wait = wait.min(next.at.saturating_duration_since(Instant::now()));
            }
        }
        if loops.iter().any(|c| c.failed.load(Ordering::SeqCst)) {
            log::error!("an event loop failed: stopping the others, then unmounting");
            stop_all(&loops);
            if server.uring {
                // Settling is not guarded: the loops finish it in the normal class.
                drop(guard.take());
                let placed = placement_stats(&placer, placed);
                let left = settle_and_leave(server, &loops, &reports, placed);
                return Served {
                    result: Err(ServeError::LoopFailed),
                    ..left
                };
            }
            break;
        }
        let mut stop = false;
        for command in server.commands.wait(wait) {
            match command {
                Command::Snapshot(reply) => {
                    let (merged, per_queue) = snapshot(&loops, &reports);
                    let placed = placement_stats(&placer, placed.clone());
                    let _ = reply.send(merged.into_report(per_queue, placed));
                }
                Command::Stop => stop = true,
            }
        }
        if stop {
            stop_all(&loops);
            if server.uring {
                drop(guard.take());
                let placed = placement_stats(&placer, placed);
                return settle_and_leave(server, &loops, &reports, placed);
            }
            break;
        }
    }
    let placed = placement_stats(&placer, placed);
    let (result, merged, per_queue) = finish(server, loops);
    Served {
        result: result.and(server.flush()),
        report: merged.into_report(per_queue, placed),
    }
}

/// Runs the idle-class guard of the ring's loops, made once every loop has decided
/// whether it went idle; returns the time until it wants to run again.
fn guard_loops(guard: &mut Option<ClassGuard>, loops: &[Started]) -> Duration {
    let now = Instant::now();
    if guard.is_none() {
        let tids: Vec<i32> = loops
            .iter()
            .map(|c| c.idle_tid.load(Ordering::SeqCst))
            .collect();
        if tids.contains(&UNDECIDED) {
            return crate::loop_class::WINDOW;
        }
        let idle: Vec<i32> = tids.into_iter().filter(|&t| t > 0).collect();
        *guard = Some(ClassGuard::new(&idle, now));
    }
    let next = guard
        .as_mut()
        .map_or(now + crate::loop_class::WINDOW, |g| g.tick(now));
    next.saturating_duration_since(now)
}

/// The placement controller's counts: the running controller's, else those it had when
/// it stopped (`None` without adaptive placement).
fn placement_stats(
    placer: &Option<(&Placement, Controller)>,
    placed: Option<ControllerStats>,
) -> Option<ControllerStats> {
    placer.as_ref().map(|(_, c)| c.stats()).or(placed)
}

type Started = Arc<Control>;

/// The stop of FUSE over io_uring: ring entries cannot be cancelled, so the loops keep
/// running until the unmount ends them. Waits until no loop serves a request, flushes, and
/// returns the last snapshot; the caller unmounts, which ends the session's part on each
/// loop (the loops finish it by themselves).
fn settle_and_leave<F: FileSystem>(
    server: &Server<F>,
    loops: &[Started],
    reports: &Receiver<LoopReport>,
    placed: Option<ControllerStats>,
) -> Served {
    let started = std::time::Instant::now();
    let (merged, per_queue) = loop {
        let (merged, per_queue) = snapshot(loops, reports);
        if merged.settled && per_queue.len() == loops.len() {
            break (merged, per_queue);
        }
        if started.elapsed() > Duration::from_secs(10) {
            log::warn!("requests still in flight after 10 s; unmounting anyway");
            break (merged, per_queue);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Give the last commits one turn of their loops to reach the kernel.
    std::thread::sleep(Duration::from_millis(10));
    Served {
        result: server.flush(),
        report: merged.into_report(per_queue, placed),
    }
}

fn start_loop<F: FileSystem>(
    server: &Server<F>,
    set: &LoopSet,
    (index, at): (usize, usize),
    placement: Option<Arc<Placement>>,
    snapshots: Sender<LoopReport>,
) -> io::Result<Started> {
    if server.uring && !set.config(at).is_some_and(|c| c.sqe128) {
        return Err(io::Error::other(
            "FUSE over io_uring needs a loop made with 128-byte SQEs (runtime::Config::sqe128)",
        ));
    }
    let control = Arc::new(Control::new()?);
    let dev = server
        .session
        .clone_queue(true)
        .map_err(|e| io::Error::new(e.kind(), format!("cloning the /dev/fuse queue: {e}")))?;
    let ring = match server.uring {
        true => Some((
            server.session.clone_queue(true)?,
            server.options.uring_depth,
        )),
        false => None,
    };
    let setup = LoopSetup {
        index,
        loops: server.queues,
        dev,
        ring,
        export: Arc::clone(&server.fs),
        max_write: server.max_write,
        queue: server.queue_config(),
        placement,
        control: Arc::clone(&control),
        snapshots,
        supervisor: Arc::clone(&server.commands),
        idle_class: server.uring && server.options.uring_idle_class,
    };
    set.run_on(
        at,
        Box::new(move |co| {
            let (control, supervisor) = (Arc::clone(&setup.control), Arc::clone(&setup.supervisor));
            let outcome = serve_part(co, setup);
            if outcome.is_err() {
                control.failed.store(true, Ordering::SeqCst);
            }
            *control.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            supervisor.wake();
        }),
    )?;
    Ok(control)
}

fn kick_all(loops: &[Started]) {
    for control in loops {
        control.kick();
    }
}

fn stop_all(loops: &[Started]) {
    for control in loops {
        control.send(&control.stop);
    }
}

/// Every loop's snapshot, merged, and each loop's queue statistics; a loop that does not
/// answer within a second is left out.
fn snapshot(loops: &[Started], reports: &Receiver<LoopReport>) -> (LoopReport, Vec<QueueStats>) {
    for control in loops {
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

/// Waits until the session's part on every loop has ended: the first error, the merged
/// final reports, each loop's queue stats.
fn finish<F: FileSystem>(
    server: &Server<F>,
    loops: Vec<Started>,
) -> (Result<(), ServeError>, LoopReport, Vec<QueueStats>) {
    while !loops.iter().all(|c| c.is_done()) {
        // Only wakes (a part ended) are expected here; a command asked for now (a
        // snapshot, stop again) is answered by the session having ended.
        drop(server.commands.wait(Duration::from_millis(100)));
    }
    let mut got = Vec::with_capacity(loops.len());
    let mut result = Ok(());
    for control in loops {
        match control
            .outcome
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            Some(Ok(report)) => got.push(report),
            Some(Err(e)) => result = result.and(Err(e)),
            None => result = result.and(Err(ServeError::LeftSession)),
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
            settled: true,
            runtime: CounterSnapshot::default(),
            queue: QueueStats::default(),
            accounting: Accounting::default(),
        }
    }

    fn into_report(self, per_queue: Vec<QueueStats>, placement: Option<ControllerStats>) -> Report {
        Report {
            runtime: self.runtime,
            queue: self.queue,
            ops: self.accounting.report(),
            per_queue,
            placement,
        }
    }

    fn add(&mut self, other: &LoopReport) {
        self.settled &= other.settled;
        self.runtime.add(&other.runtime);
        self.queue.add(&other.queue);
        self.accounting.merge(&other.accounting);
    }

    fn of<F: FileSystem>(index: usize, co: &Co<'_>, served: &LoopWork<F>) -> LoopReport {
        let mut queue = served.queue.stats();
        let mut accounting = served.queue.accounting_copy();
        if let Some(ring) = &served.ring {
            queue.add(&ring.stats());
            accounting.merge(&ring.accounting_copy());
        }
        let settled =
            served.queue.is_finished() && served.ring.as_ref().is_none_or(|r| r.is_settled());
        LoopReport {
            index,
            settled,
            runtime: co.counters(),
            queue,
            accounting,
        }
    }
}

/// What one loop serves: its /dev/fuse queue and, with `--transport uring`, its ring
/// entries.
struct LoopWork<F: FileSystem> {
    queue: Rc<Queue<F>>,
    ring: Option<Rc<RingQueues<F>>>,
}

// Not derived: a derive would ask `F: Clone`, and only the `Rc`s are cloned.
impl<F: FileSystem> Clone for LoopWork<F> {
    fn clone(&self) -> Self {
        LoopWork {
            queue: Rc::clone(&self.queue),
            ring: self.ring.clone(),
        }
    }
}

impl<F: FileSystem> LoopWork<F> {
    fn stop(&self, co: &Co<'_>) {
        self.queue.stop(co);
        if let Some(ring) = &self.ring {
            ring.stop();
        }
    }
}

/// The session's part on one loop: serve its queue until stopped or unmounted, then
/// report.
fn serve_part<F: FileSystem>(co: &Co<'_>, setup: LoopSetup<F>) -> Result<LoopReport, ServeError> {
    let index = setup.index;
    let ring = setup.ring.map(|(dev, depth)| {
        let config = RingConfig {
            depth,
            max_write: setup.max_write,
            account: setup.queue.account,
        };
        RingQueues::new(dev, Arc::clone(&setup.export), config)
    });
    let queue = Queue::new(setup.dev, setup.export, setup.max_write, setup.queue);
    let (control, snapshots, placement) = (setup.control, setup.snapshots, setup.placement);
    let loops = setup.loops;
    let idle = setup.idle_class && go_idle(index);
    // SAFETY: gettid has no preconditions.
    let tid = if idle { unsafe { libc::gettid() } } else { 0 };
    control.idle_tid.store(tid, Ordering::SeqCst);
    let served = (|| -> io::Result<LoopReport> {
        queue.start(co)?;
        if let Some(ring) = &ring {
            let qids = (0..possible_cpus()).filter(|cpu| cpu % loops == index);
            ring.start(co, qids.map(|cpu| cpu as u16))?;
        }
        let served = LoopWork {
            queue: Rc::clone(&queue),
            ring: ring.clone(),
        };
        if let Some(placement) = &placement {
            queue.count_into(placement.register(index));
            queue.share_shallow_client(placement.shallow_client());
            queue.share_shallow_pid(placement.shallow_pid());
        }
        let watcher = {
            let served = served.clone();
            co.spawn_named("control", move |co| {
                let placement = placement.as_deref();
                watch_control(co, index, &served, &control, &snapshots, placement)
            })?
        };
        let mut failure = None;
        if let Some(ring) = &ring {
            // Entries end at stop or unmount; if they died, nothing would serve the
            // requests the kernel queues for them: stop this queue too.
            ring.wait_finished(co);
            failure = ring.failure();
            queue.stop(co);
        }
        queue.wait_finished(co);
        let failure = failure.or_else(|| queue.failure());
        co.cancel_io(watcher)?;
        match failure {
            Some(why) => Err(io::Error::other(why)),
            None => Ok(LoopReport::of(index, co, &served)),
        }
    })();
    if idle {
        // The loop may go on serving other sessions: back to the normal class.
        if let Err(e) = runtime::sched_class::set_idle(0, false) {
            log::warn!("loop {index}: leaving the idle class: {e}");
        }
    }
    served.map_err(|source| ServeError::Loop { index, source })
}

/// Puts the calling loop thread in the idle class if the process may leave it again;
/// whether it did.
fn go_idle(index: usize) -> bool {
    if !runtime::sched_class::can_leave_idle() {
        log::debug!("loop {index}: stays in the normal class (a thread could not leave the idle class: no CAP_SYS_NICE, RLIMIT_NICE too low)");
        return false;
    }
    match runtime::sched_class::set_idle(0, true) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("loop {index}: cannot enter the idle class: {e}");
            false
        }
    }
}

/// Reads kicks from the main thread: a snapshot request, stop, or the placement's choice
/// for this loop (pause or resume its queue).
fn watch_control<F: FileSystem>(
    co: &Co<'_>,
    index: usize,
    served: &LoopWork<F>,
    control: &Control,
    snapshots: &Sender<LoopReport>,
    placement: Option<&Placement>,
) {
    loop {
        match control.kick.wait_in_background(co) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => {
                log::error!("waiting on the loop's control eventfd: {e}");
                return;
            }
        }
        control.kick.drain();
        match placement.map(|p| p.is_paused(index)) {
            Some(true) => served.queue.pause(co),
            Some(false) => {
                if let Err(e) = served.queue.resume(co) {
                    log::error!("loop {index}: resuming its queue: {e}");
                }
            }
            None => {}
        }
        if control.snapshot.swap(false, Ordering::SeqCst) {
            let _ = snapshots.send(LoopReport::of(index, co, served));
        }
        if control.stop.load(Ordering::SeqCst) && !control.stopped.swap(true, Ordering::SeqCst) {
            served.stop(co);
            if served.ring.is_none() {
                return;
            }
            // With ring entries the loop goes on until the unmount: keep answering the
            // main thread's snapshots, which tell it when no request is left in flight.
        }
    }
}
