//! [`LoopSet`]: event loops that serve any number of FUSE sessions, of any file systems,
//! each session taken on and let go while the others are served.
//!
//! Why: one daemon with many exports (qemu-storage-daemon's iothreads, each export naming
//! the iothreads it runs in) must not give every export loops of its own; a loop is a
//! thread with its own io_uring, coroutine and buffer pools, pinned to a CPU, and several
//! exports on one CPU serve best from one loop. [`crate::Server::serve`] makes a set of
//! its own for one mount; [`crate::Server::serve_on`] serves on a set shared with other
//! mounts ([`crate::Exports::with_loops`]).
//!
//! Each loop is a thread whose root coroutine waits on the loop's eventfd for *work*: a
//! closure run as a coroutine of its own on that loop (a session's queue, with the
//! coroutine that answers its stop and snapshots: `crate::loops`). The loop counts the
//! work running; once the set is dropped it ends when the last work has ended. Work never
//! blocks the loop except where its session asked for that (`inline` dispatch).

use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use runtime::{Co, Config, CounterSnapshot, EventFd, Runtime, WaitQueue};

/// Work for one loop: run as a coroutine of its own there.
pub(crate) type Work = Box<dyn FnOnce(&Co<'_>) + Send>;

/// How one loop is reached from other threads.
struct Inbox {
    kick: EventFd,
    work: Mutex<Vec<Work>>,
    /// The set is gone: end once no work is left.
    exit: AtomicBool,
}

/// One loop of the set: its thread, inbox and what it was made with.
struct Loop {
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
    cpu: Option<usize>,
    config: Config,
}

/// Event loops, numbered from 0 in the order they were added; sessions run on the loops
/// they are given ([`crate::Server::serve_on`]). Dropping the set lets each loop end once
/// its sessions have ended (stop or unmount them first).
pub struct LoopSet {
    loops: Mutex<Vec<Loop>>,
    /// The loops' thread names: `{name}-{index}`.
    name: String,
}

impl Default for LoopSet {
    fn default() -> Self {
        LoopSet::new()
    }
}

impl LoopSet {
    /// A set with no loop yet, whose threads are named `fuse-loop-N`.
    pub fn new() -> LoopSet {
        LoopSet::named("fuse-loop")
    }

    /// A set with no loop yet, whose threads are named `{name}-N` (`ps -L`, `top -H`;
    /// Linux keeps 15 bytes of a thread's name).
    pub fn named(name: &str) -> LoopSet {
        LoopSet {
            loops: Mutex::new(Vec::new()),
            name: name.to_string(),
        }
    }

    /// Starts one more loop with `config` (its ring, polling, accounting), pinned to `cpu`
    /// if given; returns its index.
    pub fn add_loop(&self, cpu: Option<usize>, config: Config) -> io::Result<usize> {
        let mut loops = self.lock();
        let index = loops.len();
        let inbox = Arc::new(Inbox {
            kick: EventFd::new()?,
            work: Mutex::new(Vec::new()),
            exit: AtomicBool::new(false),
        });
        let thread = {
            let inbox = Arc::clone(&inbox);
            let config = config.clone();
            std::thread::Builder::new()
                .name(format!("{}-{index}", self.name))
                .spawn(move || {
                    if let Err(e) = run(index, cpu, config, &inbox) {
                        log::error!("event loop {index}: {e}");
                    }
                })?
        };
        loops.push(Loop {
            inbox,
            thread: Some(thread),
            cpu,
            config,
        });
        Ok(index)
    }

    /// Starts `n` more loops with `config`, the i-th of them pinned to `cpus[i % len]`
    /// (none pinned if `cpus` is empty: [`crate::ServeOptions::plan_loops`]); returns
    /// their indices.
    pub fn add_loops(&self, n: usize, cpus: &[usize], config: &Config) -> io::Result<Vec<usize>> {
        (0..n)
            .map(|i| {
                let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
                self.add_loop(cpu, config.clone())
            })
            .collect()
    }

    /// How many loops the set has.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the set has no loop.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The CPU loop `index` is pinned to, if any.
    pub fn cpu(&self, index: usize) -> Option<usize> {
        self.lock().get(index).and_then(|l| l.cpu)
    }

    /// The runtime configuration loop `index` was made with.
    pub fn config(&self, index: usize) -> Option<Config> {
        self.lock().get(index).map(|l| l.config.clone())
    }

    /// Each loop's runtime counters (switches, SQEs, syscalls), in loop order; a loop that
    /// does not answer within `timeout` counts zeros.
    pub fn counters(&self, timeout: Duration) -> Vec<CounterSnapshot> {
        let n = self.len();
        let (tx, rx) = mpsc::channel();
        for index in 0..n {
            let tx = tx.clone();
            let sent = self.run_on(
                index,
                Box::new(move |co| {
                    let _ = tx.send((index, co.counters()));
                }),
            );
            if let Err(e) = sent {
                log::warn!("loop {index}: {e}");
            }
        }
        drop(tx);
        let mut got = vec![CounterSnapshot::default(); n];
        let deadline = std::time::Instant::now() + timeout;
        while let Ok((index, counters)) =
            rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
        {
            got[index] = counters;
        }
        got
    }

    /// Runs `work` as a coroutine of its own on loop `index`.
    pub(crate) fn run_on(&self, index: usize, work: Work) -> io::Result<()> {
        let inbox = {
            let loops = self.lock();
            let Some(l) = loops.get(index) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no event loop {index} (the set has {})", loops.len()),
                ));
            };
            Arc::clone(&l.inbox)
        };
        inbox
            .work
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(work);
        // Not under the set's lock: ending the loop's blocking call may take a while.
        inbox.kick.signal()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Loop>> {
        self.loops.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for LoopSet {
    /// Each loop ends once its work has ended, and the set waits for its thread (its
    /// sessions must have ended: stopped or unmounted), so that the loops' rings and
    /// stacks are gone when the set is; except loops for FUSE over io_uring, left to
    /// finish by themselves.
    fn drop(&mut self) {
        let mut loops = std::mem::take(&mut *self.lock());
        for l in &loops {
            l.inbox.exit.store(true, Ordering::SeqCst);
            if let Err(e) = l.inbox.kick.signal() {
                log::warn!("ending an event loop: {e}");
            }
        }
        for l in &mut loops {
            // Not a loop with 128-byte SQEs (FUSE over io_uring): its ring entries may
            // outlive the unmount a while; that thread finishes by itself.
            match l.thread.take() {
                Some(thread) if !l.config.sqe128 => drop(thread.join()),
                _ => {}
            }
        }
    }
}

/// One loop's thread: take work from the inbox and run each as a coroutine, until the set
/// is gone and no work is left.
fn run(index: usize, cpu: Option<usize>, config: Config, inbox: &Arc<Inbox>) -> io::Result<()> {
    if let Some(cpu) = cpu {
        runtime::affinity::pin(0, cpu)
            .map_err(|e| io::Error::new(e.kind(), format!("pinning to CPU {cpu}: {e}")))?;
    }
    let rt = Runtime::new(config)?;
    let inbox = Arc::clone(inbox);
    rt.block_on(move |co| -> io::Result<()> {
        let running = Rc::new(std::cell::Cell::new(0usize));
        let idle = Rc::new(WaitQueue::new());
        loop {
            let work = std::mem::take(&mut *inbox.work.lock().unwrap_or_else(|e| e.into_inner()));
            for work in work {
                let (running, idle) = (Rc::clone(&running), Rc::clone(&idle));
                running.set(running.get() + 1);
                co.spawn_named("loop-work", move |co| {
                    work(co);
                    running.set(running.get() - 1);
                    if running.get() == 0 {
                        idle.wake_all(co);
                    }
                })?;
            }
            if inbox.exit.load(Ordering::SeqCst) {
                while running.get() > 0 {
                    idle.wait(co);
                }
                return Ok(());
            }
            inbox.kick.wait_in_background(co)?;
            inbox.kick.drain();
        }
    })
    .map_err(|e| io::Error::new(e.kind(), format!("loop {index}: {e}")))?
}
