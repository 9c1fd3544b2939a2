//! The event loop: a run queue of ready coroutines and the io_uring that wakes the others.
//!
//! One loop turn runs every coroutine that was ready when the turn began (FIFO), then enters
//! the kernel once to submit all SQEs queued during the turn and, if nothing is ready, to
//! wait for a completion; then it moves every available CQE's coroutine to the run queue.
//!
//! This module is the loop: the [`Runtime`] and the state it owns ([`Inner`]), the turn
//! (`run_until`), waiting and reaping. The rest of `Inner`'s work is in sibling modules, one
//! job each, so that the turn reads as one page: `sched` (every key's slot and the run
//! queue), `spawn` (a spawn queues a start entry with its job, and a worker is promised
//! to it), `submit` (SQEs
//! into the ring, making room when it is full, cancels), `fast_paths` (the turns of a lone
//! coroutine without the queue, prefetching ahead of a long queue), `resume` (switching into
//! a coroutine and booking how it came back: yield, I/O, wait, done, panic) and `shutdown`
//! (the shutdown contract).

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::Instant;

use crate::co::Co;
use crate::config::Config;
use crate::coro_store::CoroStore;
use crate::counters::{CounterSnapshot, Counters};
use crate::fast_paths::Alone;
use crate::join::JoinHandle;
use crate::loop_cell::LoopCell;
use crate::poll::AdaptivePoll;
use crate::reactor::{Reactor, INTERNAL};
use crate::resume::Back;
use crate::run_queue::RunQueue;
use crate::sched::Sched;
use crate::spawn::UNNAMED;
use crate::stack_pool::StackPool;
use crate::task::{State, TaskId};
use crate::worker::START;

/// The loop's state, shared (`Rc`) by the [`Runtime`], its workers and their [`Co`]s. Its
/// methods are spread over the modules named above, one job each.
pub(crate) struct Inner {
    pub(crate) sched: LoopCell<Sched>,
    pub(crate) coros: LoopCell<CoroStore>,
    pub(crate) reactor: Reactor,
    pub(crate) stacks: LoopCell<StackPool>,
    pub(crate) counters: Counters,
    pub(crate) closing: Cell<bool>,
    pub(crate) running: Cell<bool>,
    /// The value of the resume under way, which the resumed coroutine reads once it is back
    /// from its suspend: a CQE's result for an I/O wait, `START` or `END` for an idle
    /// worker. Set before every resume that has a value to give (a yield and a wait on a
    /// queue read none); see `Coro`.
    pub(crate) resumed_with: Cell<i32>,
    poll: AdaptivePoll,
    account: bool,
    reaped_at: Cell<Option<Instant>>,
    /// This loop's identity among every loop of the process ([`Co::loop_id`]).
    pub(crate) loop_id: u64,
    /// Coroutines suspended in a background wait ([`Co::wait_in_background`]).
    pub(crate) background_waits: Cell<usize>,
    /// What ends the loop's blocking call ([`Co::block_while_idle`]), shared with the
    /// eventfds it waits on in the background.
    pub(crate) interrupt: std::sync::Arc<crate::interrupt::InterruptSlot>,
}

/// Hands out loop identities: never reused, unlike the `Inner`'s address.
static LOOP_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A single-threaded event loop running stackful coroutines over one io_uring.
///
/// ```
/// let rt = runtime::Runtime::new(Default::default())?;
/// let answer = rt.block_on(|co| {
///     co.ctx().nop().unwrap(); // one SQE, one suspend, one resume
///     6 * 7
/// })?;
/// assert_eq!(answer, 42);
/// let c = rt.counters();
/// assert_eq!((c.spawned, c.sqes_submitted, c.cqes_reaped), (1, 1, 1));
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Runtime {
    inner: Rc<Inner>,
}

impl Runtime {
    /// A loop with its own ring and stack pool.
    pub fn new(config: Config) -> io::Result<Runtime> {
        let reactor = Reactor::new(config.ring_entries, config.sqe128)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
        let inner = Inner {
            sched: LoopCell::new(Sched {
                tasks: Vec::new(),
                no_worker: Vec::new(),
                ready: RunQueue::new(),
                tops: Vec::new(),
            }),
            coros: LoopCell::new(CoroStore::new()),
            reactor,
            stacks: LoopCell::new(StackPool::new(config.stack_size, config.max_free_stacks)),
            counters: Counters::default(),
            closing: Cell::new(false),
            running: Cell::new(false),
            resumed_with: Cell::new(0),
            poll: AdaptivePoll::new(config.poll_ns),
            account: config.account,
            reaped_at: Cell::new(None),
            loop_id: LOOP_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            background_waits: Cell::new(0),
            interrupt: Default::default(),
        };
        Ok(Runtime {
            inner: Rc::new(inner),
        })
    }

    /// Starts a coroutine; it runs when the loop next runs. The same spawn as
    /// [`Co::spawn`] (one implementation, `Inner::spawn`, behind both).
    pub fn spawn(&self, f: impl FnOnce(&Co<'_>) + 'static) -> io::Result<TaskId> {
        self.inner.spawn(UNNAMED, f)
    }

    /// Starts a named coroutine (the name appears in logs, e.g. when it panics).
    pub fn spawn_named(
        &self,
        name: &'static str,
        f: impl FnOnce(&Co<'_>) + 'static,
    ) -> io::Result<TaskId> {
        self.inner.spawn(name, f)
    }

    /// Starts a coroutine whose result can be awaited with [`JoinHandle::join`].
    pub fn spawn_joinable<T: 'static>(
        &self,
        f: impl FnOnce(&Co<'_>) -> T + 'static,
    ) -> io::Result<JoinHandle<T>> {
        self.inner.spawn_joinable(UNNAMED, f)
    }

    /// Runs `f` in a coroutine and drives the loop until it finishes; other coroutines keep
    /// running meanwhile and may outlive it. A panic in `f` becomes an error.
    pub fn block_on<T: 'static>(&self, f: impl FnOnce(&Co<'_>) -> T + 'static) -> io::Result<T> {
        let handle = self.inner.spawn_joinable("block_on", f)?;
        self.run_until(|| handle.is_finished())?;
        handle
            .try_take()
            .expect("finished")
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Drives the loop until no coroutine is left.
    pub fn run(&self) -> io::Result<()> {
        self.run_until(|| false)
    }

    /// Drives the loop until `stop()` holds (checked after every turn) or no coroutine is
    /// left. Fails if coroutines remain but none can ever run (all wait on queues with no
    /// I/O in flight), or if the ring fails.
    pub fn run_until(&self, stop: impl FnMut() -> bool) -> io::Result<()> {
        if self.inner.running.replace(true) {
            return Err(io::Error::other("the event loop is already running"));
        }
        /// Marks the loop stopped when `run_until` returns or `stop()` unwinds out of it,
        /// so that the runtime can still be run again or shut down.
        struct Stopped<'a>(&'a Cell<bool>);
        impl Drop for Stopped<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let _stopped = Stopped(&self.inner.running);
        self.inner.run_until(stop)
    }

    /// A copy of the loop's counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.inner.counters()
    }

    /// Pooled capacity kept for reuse: idle workers plus bare stacks.
    pub fn free_stacks(&self) -> usize {
        self.inner.stacks.with(|pool| pool.len())
    }

    /// Cancels what is in flight, waits for the kernel to let go of every buffer, then
    /// unwinds and frees every remaining coroutine (see the shutdown contract, module `shutdown`).
    /// Idempotent; [`Drop`] calls it.
    pub fn shutdown(&self) -> io::Result<()> {
        self.inner.shutdown()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Err(e) = self.inner.shutdown() {
            log::error!("runtime shutdown: {e}");
        }
    }
}

impl Inner {
    /// A copy of the loop's counters.
    pub(crate) fn counters(&self) -> CounterSnapshot {
        let queued_starts = self.stacks.with(|pool| pool.promised());
        self.counters.snapshot(queued_starts)
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Whether coroutines time their I/O waits (`Config::account`).
    #[inline(always)]
    pub(crate) fn accounting(&self) -> bool {
        self.account
    }

    pub(crate) fn reaped_at(&self) -> Option<Instant> {
        self.reaped_at.get()
    }

    fn run_until(&self, mut stop: impl FnMut() -> bool) -> io::Result<()> {
        'turns: loop {
            self.sched.with(|s| s.ready.start_turn());
            while let Some((key, value)) = self.sched.with(|s| s.ready.pop_in_turn()) {
                self.prefetch_ahead();
                let key = if value == START {
                    self.start_worker()
                } else {
                    key
                };
                match self.run_task(key, value) {
                    Back::Yielded => {
                        if !self.sched.with(|s| s.ready.in_turn()) && self.alone() {
                            if self.run_alone(key, &mut stop) {
                                return Ok(());
                            }
                        } else {
                            self.sched.with(|s| s.ready.push_back((key, 0)));
                        }
                    }
                    Back::Io if self.waits_alone() => match self.wait_alone(key, &mut stop)? {
                        Alone::Stopped => return Ok(()),
                        // `stop()` was just checked and the completions reaped.
                        Alone::Reaped => continue 'turns,
                        Alone::Ran => {}
                    },
                    Back::Io | Back::Other => {}
                }
            }
            if stop() {
                return Ok(());
            }
            let idle = self.sched.with(|s| s.ready.is_empty());
            if self.reactor.in_flight() > 0 {
                if idle {
                    self.wait()?;
                } else {
                    self.reactor.enter(0, &self.counters)?;
                }
                self.reap();
            } else if idle {
                let live = self.counters.live();
                if live == 0 {
                    return Ok(());
                }
                return Err(io::Error::other(format!(
                    "deadlock: {live} coroutines wait on queues, none is ready and no I/O is in flight"
                )));
            }
        }
    }

    /// Waits for at least one completion: spinning first when polling is on.
    #[inline(always)]
    pub(crate) fn wait(&self) -> io::Result<()> {
        if self.poll.enabled() {
            self.wait_polling()
        } else {
            self.reactor.enter(1, &self.counters)
        }
    }

    /// Waits for a completion, spinning first (see `poll`): submit what is queued, watch
    /// the completion queue for the current window, then sleep in the kernel if nothing
    /// came. A completion caught while spinning costs no sleep and no wakeup.
    fn wait_polling(&self) -> io::Result<()> {
        self.reactor.enter(0, &self.counters)?;
        let start = Instant::now();
        let window = self.poll.window();
        let caught = loop {
            if self.reactor.has_completions() {
                break true;
            }
            if start.elapsed() >= window {
                break false;
            }
            std::hint::spin_loop();
        };
        if caught {
            self.counters.poll_hits.bump();
        } else {
            self.counters.poll_misses.bump();
            self.reactor.enter(1, &self.counters)?;
        }
        self.poll.adjust(start.elapsed());
        Ok(())
    }

    /// Moves the coroutine of every available CQE to the run queue.
    #[inline(always)]
    pub(crate) fn reap(&self) {
        let reaped = self.reactor.reap(&self.counters, |user_data, result| {
            if let Some(key) = self.completed(user_data) {
                self.sched.with(|s| s.ready.push_back((key, result)));
            }
        });
        self.reaped(reaped);
    }

    /// Books the CQE of `user_data`: the key of the coroutine it makes ready, now marked
    /// so, or `None` for the loop's own SQEs.
    #[inline(always)]
    pub(crate) fn completed(&self, user_data: u64) -> Option<usize> {
        if user_data == INTERNAL {
            return None;
        }
        let key = user_data as usize;
        self.sched.with(|s| {
            // SAFETY: a CQE's `user_data` is its SQE's, and every SQE but the loop's own
            // (`INTERNAL`, above) carries the key of the coroutine that waits for it.
            let slot = unsafe { s.slot_unchecked(key) };
            debug_assert_eq!(slot.state, State::Io, "CQE for key {key} not in I/O");
            slot.state = State::Ready;
        });
        Some(key)
    }

    /// Notes when completions were last reaped, if the loop measures it (one test of
    /// `account` when it does not).
    #[inline(always)]
    pub(crate) fn reaped(&self, reaped: usize) {
        if self.account {
            self.note_reaped(reaped);
        }
    }

    #[inline(never)]
    fn note_reaped(&self, reaped: usize) {
        if reaped > 0 {
            self.reaped_at.set(Some(Instant::now()));
        }
    }
}
