//! The event loop: a run queue of ready coroutines and the io_uring that wakes the others.
//!
//! One loop turn runs every coroutine that was ready when the turn began (FIFO), then enters
//! the kernel once to submit all SQEs queued during the turn and, if nothing is ready, to
//! wait for a completion; then it moves every available CQE's coroutine to the run queue.
//! A coroutine that yields as the last of its turn, with nothing else ready and nothing in
//! flight, is resumed again at once (`run_alone`); one that parks on I/O with nothing else
//! ready is resumed in place when the next wait reaps its CQE alone (`wait_alone`): the
//! same turns, without the queue. With hundreds of coroutines queued, the loop prefetches
//! the stack top of the one 9 places behind the one it resumes (`prefetch_ahead`):
//! resuming a coroutine whose stack page is cold waits for its translation and its line
//! otherwise.
//!
//! A spawn queues its closure in the job queue, and in the run queue an entry that starts an
//! idle worker ([`START`]): a pooled one, or one made now (so a failure to map a stack is
//! the spawn's error). When the loop reaches that entry it resumes the worker, which takes
//! the job queue's oldest job; when a worker's job returns and the next entry of the turn
//! starts another worker, the finished worker takes that job itself and puts the other
//! worker back among the idle (`chain_job`): the same order, without two switches.
//!
//! # Shutdown contract
//! Dropping a [`Runtime`] (or calling [`Runtime::shutdown`]) with coroutines alive:
//! 1. new submissions and spawns are refused with `ECANCELED`;
//! 2. every SQE in flight gets an `IORING_OP_ASYNC_CANCEL`, and the loop waits until the CQE
//!    of every SQE has been reaped: the kernel is done with every buffer;
//! 3. only then is each remaining coroutine dropped, which unwinds its stack (destructors run;
//!    any I/O they attempt fails at once with `ECANCELED`), and its stack is freed. A job that
//!    never started is dropped unrun, and idle workers (see `worker`) are ended by resuming
//!    them with an empty job slot: neither has anything to unwind.
//!
//! If the ring fails while draining, the coroutines and their stacks are leaked on purpose:
//! memory the kernel may still write to is never freed.

use std::cell::Cell;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Instant;

use corosensei::CoroutineResult;
use io_uring::{opcode, squeue};

use crate::co::{Co, SuspendHook};
use crate::colored_stack::ColoredStack;
use crate::config::Config;
use crate::coro_store::CoroStore;
use crate::counters::{CounterSnapshot, Counters};
use crate::job::Job;
use crate::job_queue::JobQueue;
use crate::join::{JoinHandle, JoinState};
use crate::loop_cell::LoopCell;
use crate::poll::AdaptivePoll;
use crate::reactor::{Reactor, INTERNAL};
use crate::run_queue::RunQueue;
use crate::stack_pool::StackPool;
use crate::task::{Coro, Park, Slot, State, TaskId};
use crate::worker::{worker, END, START};
use corosensei::stack::Stack;

/// Queue lengths from which the loop prefetches stacks ahead: below this, the coroutines'
/// stacks stay in the caches and translation buffers anyway.
const PREFETCH_FROM: usize = 256;
/// How many places behind the coroutine being resumed the loop prefetches.
const PREFETCH_AHEAD: usize = 9;

/// Hints the CPU to fetch the line at `address` (any address: a prefetch never faults).
#[inline(always)]
fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect and does not fault, whatever the
    // address; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// How [`Inner::wait_alone`] handed back to the general loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alone {
    /// `stop()` held.
    Stopped,
    /// Completions were reaped (or `stop()` made a coroutine ready) and `stop()` was checked
    /// after the last turn: the next turn starts.
    Reaped,
    /// The coroutine ran a turn and left the fast path: the turn ends as any other.
    Ran,
}

/// How a coroutine came back to the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Back {
    /// It yielded: it is to be queued again.
    Yielded,
    /// It waits for the CQE of its SQE.
    Io,
    /// It waits on a queue, or its job ended, or it panicked.
    Other,
}

/// Every key's slot, the free keys that have no worker, and the run queue of
/// `(key, resume value)`. Free keys with an idle worker are in the `StackPool`.
struct Sched {
    tasks: Vec<Slot>,
    no_worker: Vec<usize>,
    ready: RunQueue,
    /// Each key's worker's stack top, set when its worker is made (stale for a key whose
    /// worker ended: such a key is never queued): what `prefetch_ahead` warms.
    tops: Vec<usize>,
}

impl Sched {
    /// A free key for a new worker.
    fn new_key(&mut self) -> usize {
        self.no_worker.pop().unwrap_or_else(|| {
            self.tasks.push(Slot {
                state: State::Free,
                id: TaskId(0),
                name: "",
            });
            self.tasks.len() - 1
        })
    }

    /// Frees the slot of a coroutine that ended; returns what it was.
    fn release(&mut self, key: usize) -> Slot {
        let free = Slot {
            state: State::Free,
            id: TaskId(0),
            name: "",
        };
        std::mem::replace(&mut self.tasks[key], free)
    }

    fn live_keys(&self, state: impl Fn(State) -> bool) -> Vec<usize> {
        let live = self.tasks.iter().enumerate();
        live.filter(|(_, slot)| slot.state != State::Free && state(slot.state))
            .map(|(key, _)| key)
            .collect()
    }
}

pub(crate) struct Inner {
    sched: LoopCell<Sched>,
    coros: LoopCell<CoroStore>,
    jobs: LoopCell<JobQueue>,
    reactor: Reactor,
    stacks: LoopCell<StackPool>,
    pub(crate) counters: Counters,
    closing: Cell<bool>,
    running: Cell<bool>,
    /// The running coroutine's [`Co::on_first_suspend`] hook, while armed (its lifetime
    /// erased: it is cleared before that call returns or unwinds).
    pub(crate) suspend_hook: Cell<Option<NonNull<SuspendHook<'static>>>>,
    poll: AdaptivePoll,
    account: bool,
    reaped_at: Cell<Option<Instant>>,
}

/// A single-threaded event loop running stackful coroutines over one io_uring.
///
/// ```
/// let rt = runtime::Runtime::new(Default::default())?;
/// let answer = rt.block_on(|co| {
///     co.nop().unwrap(); // one SQE, one suspend, one resume
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
            jobs: LoopCell::new(JobQueue::new()),
            reactor,
            stacks: LoopCell::new(StackPool::new(config.stack_size, config.max_free_stacks)),
            counters: Counters::default(),
            closing: Cell::new(false),
            running: Cell::new(false),
            suspend_hook: Cell::new(None),
            poll: AdaptivePoll::new(config.poll_ns),
            account: config.account,
            reaped_at: Cell::new(None),
        };
        Ok(Runtime {
            inner: Rc::new(inner),
        })
    }

    /// Starts a coroutine; it runs when the loop next runs.
    pub fn spawn(&self, f: impl FnOnce(&Co<'_>) + 'static) -> io::Result<TaskId> {
        self.inner.spawn("task", f)
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
        self.inner.spawn_joinable("task", f)
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
        let result = self.inner.run_until(stop);
        self.inner.running.set(false);
        result
    }

    /// A copy of the loop's counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }

    /// Pooled capacity kept for reuse: idle workers plus bare stacks.
    pub fn free_stacks(&self) -> usize {
        self.inner.stacks.with(|pool| pool.len())
    }

    /// Cancels what is in flight, waits for the kernel to let go of every buffer, then
    /// unwinds and frees every remaining coroutine (see the module's shutdown contract).
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
    /// Queues `f`, and the start of an idle worker for it (a pooled one, or a new one on a
    /// pooled or fresh stack).
    #[inline]
    pub(crate) fn spawn<F>(self: &Rc<Self>, name: &'static str, f: F) -> io::Result<TaskId>
    where
        F: FnOnce(&Co<'_>) + 'static,
    {
        if self.closing.get() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let key = match self.stacks.with(|pool| pool.pop_idle()) {
            Some(key) => key,
            None => self.new_worker()?,
        };
        // Ids count the spawns from 1.
        let id = TaskId(self.counters.spawned.get() + 1);
        if self.jobs.with(|jobs| jobs.push(id, name, f)) {
            self.counters.jobs_boxed.bump();
        }
        self.sched.with(|s| s.ready.push_back((key, START)));
        self.counters.started();
        Ok(id)
    }

    /// A new worker at a free key, for the job being spawned.
    #[cold]
    #[inline(never)]
    fn new_worker(self: &Rc<Self>) -> io::Result<usize> {
        let stack = self.stacks.with(|pool| pool.take(&self.counters))?;
        let key = self.sched.with(|s| s.new_key());
        let stack = ColoredStack::new(stack, key);
        let top = stack.base().get();
        let co = worker(stack, Rc::clone(self), key);
        self.sched.with(|s| {
            if s.tops.len() <= key {
                s.tops.resize(key + 1, 0);
            }
            s.tops[key] = top;
        });
        self.coros.with(|coros| coros.put(key, co));
        Ok(key)
    }

    /// The job queue's oldest job, for the worker at `key` (which the loop started, or which
    /// chained the job); books it as that key's coroutine.
    #[inline(always)]
    pub(crate) fn take_job(&self, key: usize) -> (NonNull<Job>, TaskId) {
        let job = self.jobs.with(|jobs| jobs.pop());
        let job = job.expect("every worker start has its job");
        // SAFETY: the slot was just released and nothing touches it before the worker
        // runs it (see `JobQueue`).
        let (id, name) = unsafe { Job::identity(job.as_ptr()) };
        self.sched.with(|s| {
            s.tasks[key] = Slot {
                state: State::Ready,
                id,
                name,
            }
        });
        (job, id)
    }

    /// Called by a worker whose job returned: whether the next entry of this turn starts a
    /// worker on a job, which it then takes from the run queue to run that job itself (the
    /// worker it was for goes back among the idle).
    #[inline(always)]
    pub(crate) fn chain_job(&self) -> bool {
        let next = self
            .sched
            .with(|s| s.ready.pop_in_turn_if(|(_, value)| value == START));
        match next {
            Some((unused, _)) => {
                self.stacks.with(|pool| pool.park_idle(unused));
                self.counters.chained.bump();
                true
            }
            None => false,
        }
    }

    pub(crate) fn spawn_joinable<T, F>(
        self: &Rc<Self>,
        name: &'static str,
        f: F,
    ) -> io::Result<JoinHandle<T>>
    where
        T: 'static,
        F: FnOnce(&Co<'_>) -> T + 'static,
    {
        let state = Rc::new(JoinState::new());
        let theirs = Rc::clone(&state);
        let id = self.spawn(name, move |co| theirs.run(co, f))?;
        Ok(JoinHandle::new(state, id))
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

    /// Queues an SQE for the coroutine at `key`; flushes (and reaps) when the queue is full.
    ///
    /// # Safety
    /// The memory the SQE points to stays valid until its CQE is reaped.
    #[inline(always)]
    pub(crate) unsafe fn push_sqe(&self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        if unsafe { self.reactor.try_push(entry) } {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.push_sqe_full(entry) }
    }

    /// [`Inner::push_sqe`] when the submission queue is full.
    ///
    /// # Safety
    /// As [`Inner::push_sqe`].
    #[cold]
    #[inline(never)]
    unsafe fn push_sqe_full(&self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            self.make_room()?;
            // SAFETY: forwarded from the caller.
            if unsafe { self.reactor.try_push(entry) } {
                return Ok(());
            }
        }
    }

    /// As [`Inner::push_sqe`] for a 128-byte SQE.
    ///
    /// # Safety
    /// As [`Inner::push_sqe`].
    pub(crate) unsafe fn push_sqe128(&self, entry: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        while !unsafe { self.reactor.try_push128(entry)? } {
            self.make_room()?;
        }
        Ok(())
    }

    fn make_room(&self) -> io::Result<()> {
        self.reactor.enter(0, &self.counters)?;
        self.reap();
        Ok(())
    }

    /// Makes a coroutine parked on a wait queue ready, if `key` still names that coroutine
    /// and it is still waiting. Returns whether it did.
    pub(crate) fn wake(&self, key: usize, id: TaskId) -> bool {
        if self.closing.get() {
            return false;
        }
        self.sched.with(|s| match s.tasks.get_mut(key) {
            Some(slot) if slot.id == id && slot.state == State::Waiting => {
                slot.state = State::Ready;
                s.ready.push_back((key, 0));
                true
            }
            _ => false,
        })
    }

    /// Asks the kernel to cancel the SQE the coroutine `id` waits on (`IORING_OP_ASYNC_CANCEL`,
    /// Linux 5.5); that coroutine then resumes with `ECANCELED` (or with the operation's own
    /// result, if it completed first). Returns whether `id` was waiting on I/O.
    pub(crate) fn cancel_io(&self, id: TaskId) -> io::Result<bool> {
        let key = self.sched.with(|s| {
            let io = s.live_keys(|state| state == State::Io);
            io.into_iter().find(|&key| s.tasks[key].id == id)
        });
        let Some(key) = key else {
            return Ok(false);
        };
        self.push_cancel(key)?;
        Ok(true)
    }

    /// Queues an `IORING_OP_ASYNC_CANCEL` for the SQE of the coroutine at `key`.
    fn push_cancel(&self, key: usize) -> io::Result<()> {
        let cancel = opcode::AsyncCancel::new(key as u64)
            .build()
            .user_data(INTERNAL);
        // SAFETY: a cancel request points to no memory.
        unsafe { self.push_sqe(&cancel) }
    }

    fn run_until(&self, mut stop: impl FnMut() -> bool) -> io::Result<()> {
        'turns: loop {
            self.sched.with(|s| s.ready.start_turn());
            while let Some((key, value)) = self.sched.with(|s| s.ready.pop_in_turn()) {
                self.prefetch_ahead();
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
                let live = self.counters.live.get();
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
    fn wait(&self) -> io::Result<()> {
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
    fn reap(&self) {
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
    fn completed(&self, user_data: u64) -> Option<usize> {
        if user_data == INTERNAL {
            return None;
        }
        let key = user_data as usize;
        self.sched.with(|s| {
            let slot = &mut s.tasks[key];
            debug_assert_eq!(slot.state, State::Io, "CQE for {} not in I/O", slot.id);
            slot.state = State::Ready;
        });
        Some(key)
    }

    /// Notes when completions were last reaped, if the loop measures it.
    #[inline(always)]
    fn reaped(&self, reaped: usize) {
        if self.account && reaped > 0 {
            self.reaped_at.set(Some(Instant::now()));
        }
    }

    /// Whether the coroutine that just parked on I/O is the only one the loop could run
    /// next: nothing else is ready (other SQEs may be in flight).
    #[inline(always)]
    fn waits_alone(&self) -> bool {
        self.sched.with(|s| s.ready.is_empty())
    }

    /// The fast path for a coroutine that parked on I/O with nothing else ready
    /// (`waits_alone`): the loop waits, and when the only CQE it reaps is that coroutine's,
    /// resumes it in place, without the run queue, for as long as this repeats. That is the
    /// turn the loop would have run. Each wait ends a turn: `stop` is checked before it.
    /// Any other CQE, yield or spawn sends it all back to the general loop, in CQE order;
    /// so does a `stop()` that makes another coroutine ready. Out of line: its loop then
    /// keeps to a small frame of its own (a NOP round trip touches two cache lines fewer
    /// than inside `run_until`).
    #[inline(never)]
    fn wait_alone(&self, key: usize, stop: &mut impl FnMut() -> bool) -> io::Result<Alone> {
        // Looked up once: the slot stays put while its coroutine lives.
        let slot = self.coros.with(|coros| coros.slot(key));
        loop {
            if stop() {
                return Ok(Alone::Stopped);
            }
            if !self.waits_alone() {
                return self.made_ready_by_stop();
            }
            self.wait()?;
            let mut mine = None;
            let reaped = self.reactor.reap(&self.counters, |user_data, result| {
                let Some(ready) = self.completed(user_data) else {
                    return;
                };
                self.sched.with(|s| {
                    if ready == key && mine.is_none() && s.ready.is_empty() {
                        mine = Some(result);
                        return;
                    }
                    // Not alone after all: queue everything, in CQE order.
                    if let Some(first) = mine.take() {
                        s.ready.push_back((key, first));
                    }
                    s.ready.push_back((ready, result));
                });
            });
            self.reaped(reaped);
            let Some(result) = mine else {
                if self.sched.with(|s| s.ready.is_empty()) {
                    continue; // woken without a coroutine's CQE (EINTR, a cancel's CQE)
                }
                return Ok(Alone::Reaped);
            };
            match self.run_in(slot, key, result) {
                Back::Io if self.waits_alone() => continue,
                Back::Yielded => {
                    self.sched.with(|s| s.ready.push_back((key, 0)));
                    return Ok(Alone::Ran);
                }
                Back::Io | Back::Other => return Ok(Alone::Ran),
            }
        }
    }

    /// Whether the coroutine that just yielded is the only thing the loop has to do: no
    /// other coroutine is ready and no I/O is in flight (so no submit or reap is due).
    #[inline(always)]
    fn alone(&self) -> bool {
        self.reactor.in_flight() == 0 && self.sched.with(|s| s.ready.is_empty())
    }

    /// The fast path for one ready coroutine: it yielded as the last of its turn and is
    /// `alone`, so it is resumed again without the run queue. Each resume is a turn of its
    /// own: `stop` is checked before it, as after any turn, and the coroutine goes back to
    /// the queue as soon as anything else is ready or in flight (FIFO is kept). Returns
    /// whether `stop()` held.
    #[inline]
    fn run_alone(&self, key: usize, stop: &mut impl FnMut() -> bool) -> bool {
        // Looked up once: the slot stays put while its coroutine lives.
        let slot = self.coros.with(|coros| coros.slot(key));
        loop {
            if stop() {
                self.sched.with(|s| s.ready.push_back((key, 0)));
                return true;
            }
            if self.run_in(slot, key, 0) != Back::Yielded {
                return false;
            }
            if !self.alone() {
                self.sched.with(|s| s.ready.push_back((key, 0)));
                return false;
            }
        }
    }

    /// With many coroutines queued, starts fetching the top of the stack of the one
    /// [`PREFETCH_AHEAD`] places behind the one being resumed (popped just before): its
    /// page's translation and its first line, which a resume of a cold coroutine otherwise
    /// waits for (benches/HISTORY.md, scaling).
    #[inline(always)]
    fn prefetch_ahead(&self) {
        self.sched.with(|s| {
            if s.ready.len() < PREFETCH_FROM {
                return;
            }
            if let Some(key) = s.ready.key_ahead(PREFETCH_AHEAD - 1) {
                prefetch(s.tops[key].wrapping_sub(64));
            }
        });
    }

    /// [`Inner::wait_alone`] when `stop()` spawned or woke a coroutine: as the general loop
    /// would, submit and reap without waiting, and let the next turn run it.
    #[cold]
    #[inline(never)]
    fn made_ready_by_stop(&self) -> io::Result<Alone> {
        self.reactor.enter(0, &self.counters)?;
        self.reap();
        Ok(Alone::Reaped)
    }

    /// Switches into one coroutine, in place in its slot, and books how it came back.
    /// When it yielded (`Park::Yield`), the caller queues it.
    #[inline(always)]
    fn run_task(&self, key: usize, value: i32) -> Back {
        self.run_in(self.coros.with(|coros| coros.slot(key)), key, value)
    }

    /// [`Inner::run_task`] with the slot of `key` already looked up.
    #[inline(always)]
    fn run_in(&self, slot: NonNull<Option<Coro>>, key: usize, value: i32) -> Back {
        self.counters.resumes.bump();
        // SAFETY: the slot's address is stable for the store's life (see `CoroStore`), and
        // while this coroutine runs nothing else touches its slot: only `retire` and `end`
        // below take it out, after `resume` has returned.
        let co = unsafe { &mut *slot.as_ptr() }
            .as_mut()
            .expect("a ready coroutine is in its slot");
        match panic::catch_unwind(AssertUnwindSafe(|| co.resume(value))) {
            Ok(CoroutineResult::Yield(Park::Yield)) => {
                self.counters.suspends.bump();
                Back::Yielded
            }
            Ok(CoroutineResult::Yield(Park::Done)) => {
                self.retire(key);
                Back::Other
            }
            Ok(CoroutineResult::Yield(Park::Io)) => {
                self.counters.suspends.bump();
                self.sched.with(|s| s.tasks[key].state = State::Io);
                Back::Io
            }
            Ok(CoroutineResult::Yield(Park::Wait)) => {
                self.counters.suspends.bump();
                self.sched.with(|s| s.tasks[key].state = State::Waiting);
                Back::Other
            }
            Ok(CoroutineResult::Return(())) => {
                unreachable!("a worker returns only when resumed without a job")
            }
            Err(payload) => {
                self.panicked(key, payload);
                Back::Other
            }
        }
    }

    /// Books the panic of the coroutine at `key` and ends its worker.
    #[cold]
    #[inline(never)]
    fn panicked(&self, key: usize, payload: Box<dyn std::any::Any + Send>) {
        self.counters.finished(true);
        let slot = self.sched.with(|s| s.release(key));
        let co = self.coros.with(|coros| coros.take(key));
        self.end(key, co.expect("a panicked coroutine is in its slot"));
        log::error!(
            "coroutine {} ({}) panicked: {}; the loop goes on",
            slot.id,
            slot.name,
            panic_message(&*payload)
        );
    }

    /// Frees the slot of a coroutine whose job returned; its worker stays idle in the pool,
    /// and idle workers beyond the pool's bound end.
    #[inline(always)]
    fn retire(&self, key: usize) {
        self.sched.with(|s| s.tasks[key].state = State::Free);
        if self.stacks.with(|pool| {
            pool.park_idle(key);
            pool.over_bound()
        }) {
            self.trim();
        }
    }

    /// Ends idle workers while the pool is over its bound.
    #[cold]
    #[inline(never)]
    fn trim(&self) {
        while let Some(key) = self.stacks.with(|pool| {
            if pool.over_bound() {
                pool.pop_idle()
            } else {
                None
            }
        }) {
            self.end_idle(key);
        }
    }

    /// Ends the idle worker at `key`: resumed with [`END`], it returns.
    fn end_idle(&self, key: usize) {
        let mut co = self
            .coros
            .with(|coros| coros.take(key))
            .expect("an idle worker is in its slot");
        let ended = co.resume(END);
        debug_assert!(matches!(ended, CoroutineResult::Return(())));
        self.end(key, co);
    }

    /// Pools the stack of a worker that has ended, and frees its key.
    fn end(&self, key: usize, co: Coro) {
        self.stacks
            .with(|pool| pool.give(co.into_stack().into_inner()));
        self.sched.with(|s| s.no_worker.push(key));
    }

    fn shutdown(&self) -> io::Result<()> {
        if self.running.get() {
            return Err(io::Error::other(
                "shutdown from inside the running loop; stop the loop first",
            ));
        }
        self.closing.set(true);
        self.cancel_in_flight();
        while self.reactor.in_flight() > 0 {
            if let Err(e) = self.reactor.enter(1, &self.counters) {
                std::mem::forget(self.take_all());
                return Err(io::Error::new(
                    e.kind(),
                    format!("draining I/O at shutdown ({e}); leaking coroutine stacks"),
                ));
            }
            self.reactor.reap(&self.counters, |_, _| {});
        }
        // Take every job and coroutine out before dropping any: dropping a closure runs its
        // destructors, and so does unwinding a coroutine; they may call back into the loop.
        let (jobs, workers) = self.take_all();
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| drop(jobs))) {
            log::error!(
                "a job dropped unrun at shutdown panicked: {}",
                panic_message(&*payload)
            );
        }
        for (slot, co) in workers {
            let ended = panic::catch_unwind(AssertUnwindSafe(|| end_at_shutdown(&slot, co)));
            if let Err(payload) = ended {
                log::error!(
                    "coroutine {} ({}) panicked while unwinding at shutdown: {}",
                    slot.id,
                    slot.name,
                    panic_message(&*payload)
                );
            }
        }
        Ok(())
    }

    /// Every job that never started, and every remaining worker with its slot (idle workers
    /// come with a free slot); leaves the loop empty.
    fn take_all(&self) -> (Vec<Job>, Vec<(Slot, Coro)>) {
        let jobs = self.jobs.with(|jobs| jobs.drain());
        let mut idle = self.stacks.with(|pool| pool.drain_idle());
        let slots: Vec<(usize, Slot)> = self.sched.with(|s| {
            // Workers a queued job was to start are idle too.
            idle.extend(s.ready.keys_with(START));
            s.ready.clear();
            let live = s.live_keys(|_| true).into_iter();
            let mut slots: Vec<_> = live.map(|k| (k, s.release(k))).collect();
            debug_assert!(slots.iter().all(|(_, slot)| slot.state != State::Free));
            slots.extend(idle.into_iter().map(|k| (k, s.tasks[k])));
            slots
        });
        let workers = self.coros.with(|coros| {
            let taken = slots.into_iter();
            taken
                .filter_map(|(key, slot)| Some((slot, coros.take(key)?)))
                .collect()
        });
        (jobs, workers)
    }

    fn cancel_in_flight(&self) {
        let waiting = self.sched.with(|s| s.live_keys(|state| state == State::Io));
        for key in waiting {
            if let Err(e) = self.push_cancel(key) {
                log::warn!("could not cancel I/O of a coroutine at shutdown: {e}");
            }
        }
    }
}

/// Ends a worker at shutdown: an idle one (or one never started), resumed with [`END`],
/// returns; one suspended inside its job is dropped, which unwinds its stack.
fn end_at_shutdown(slot: &Slot, mut co: Coro) {
    if slot.state == State::Free {
        co.resume(END);
    }
    drop(co);
}

/// The text of a panic payload, as the standard panic hook shows it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "Box<dyn Any>"
    }
}
