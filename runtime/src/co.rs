//! [`Co`]: what a running coroutine holds to suspend itself, spawn others and submit I/O
//! (through [`Co::ctx`]: [`Ctx`] is the one public I/O API).

use std::cell::Cell;
use std::io;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::{Duration, Instant};

use corosensei::Yielder;
use io_uring::squeue;

use crate::counters::CounterSnapshot;
use crate::ctx::Ctx;
use crate::executor::Inner;
use crate::join::JoinHandle;
use crate::spawn::UNNAMED;
use crate::task::{Identity, Park, TaskId};

/// The handle a coroutine receives: its identity, and the way back to its event loop.
///
/// A `Co` exists only on its coroutine's stack, so every suspending call is made by a
/// coroutine, never by the loop. It is neither `Send` nor `Sync`: a coroutine never moves to
/// another thread.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<runtime::Co<'static>>();
/// ```
pub struct Co<'a> {
    yielder: &'a Yielder<(), Park>,
    /// The loop, one load away (every suspend and submit reads it).
    pub(crate) inner: &'a Inner,
    /// The same loop as an `Rc`, for spawns (a new worker holds a strong count).
    rc: &'a Rc<Inner>,
    key: usize,
    /// The current job's identity, which the loop reads in place (see `Identity`).
    pub(crate) identity: Identity,
    /// This coroutine's [`Co::on_first_suspend`] hook, while armed (its lifetime erased:
    /// it is cleared before that call returns or unwinds). Beside `suspends`, which every
    /// suspend writes anyway, so checking it costs no line and one load.
    hook: Cell<Option<NonNull<SuspendHook<'static>>>>,
    suspends: Cell<u32>,
    sqes: Cell<u32>,
    io_wait_ns: Cell<u64>,
}

/// A coroutine that waits in [`Co::wait_woken`], as another coroutine of the same loop
/// wakes it ([`Co::wake_local`]). Plain data (`Send`): it may sit in state shared with other
/// threads, which cannot wake it but can tell, by [`LocalWaker::loop_id`], that it is not
/// theirs to wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalWaker {
    loop_id: u64,
    key: usize,
    id: TaskId,
}

impl LocalWaker {
    /// The loop the coroutine runs on ([`Co::loop_id`]).
    pub fn loop_id(&self) -> u64 {
        self.loop_id
    }
}

/// What [`Co::on_first_suspend`] runs.
pub(crate) type SuspendHook<'h> = dyn Fn(&Co<'_>) + 'h;

/// What one coroutine has done so far: the raw material of per-request accounting.
/// Kept on the coroutine's own stack, so counting costs no shared state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoStats {
    /// Times it handed control back to the loop (each is two switches with the resume).
    pub suspends: u32,
    /// SQEs it submitted.
    pub sqes: u32,
    /// Time spent suspended on its SQEs, when the runtime measures it
    /// ([`Config::account`](crate::Config::account)); zero otherwise.
    pub io_wait: Duration,
}

impl<'a> Co<'a> {
    /// The `Co` of the worker at `key`, before its first job.
    pub(crate) fn new(yielder: &'a Yielder<(), Park>, rc: &'a Rc<Inner>, key: usize) -> Self {
        Co {
            yielder,
            inner: rc,
            rc,
            key,
            identity: Identity {
                id: Cell::new(TaskId(0)),
                name: Cell::new(""),
            },
            hook: Cell::new(None),
            suspends: Cell::new(0),
            sqes: Cell::new(0),
            io_wait_ns: Cell::new(0),
        }
    }

    /// This coroutine's I/O context, [`Ctx::Coroutine`]: every operation on the ring goes
    /// through it (`co.ctx().read(&dev, buf)`), with the same methods a blocking caller
    /// has. Free: the variant is known here, and each method folds its `match` away.
    #[inline(always)]
    pub fn ctx(&self) -> Ctx<'_> {
        Ctx::Coroutine(self)
    }

    /// What this coroutine has done so far (suspends, SQEs, time waiting on them).
    pub fn stats(&self) -> CoStats {
        CoStats {
            suspends: self.suspends.get(),
            sqes: self.sqes.get(),
            io_wait: Duration::from_nanos(self.io_wait_ns.get()),
        }
    }

    /// When the loop last reaped completions, if the runtime measures it
    /// ([`Config::account`](crate::Config::account)): just after resuming from I/O, the
    /// time since then is how long this coroutine waited in the run queue.
    pub fn reaped_at(&self) -> Option<Instant> {
        self.inner.reaped_at()
    }

    /// This coroutine's identity.
    pub fn id(&self) -> TaskId {
        self.identity.id.get()
    }

    /// This coroutine's name (the one it was spawned with, `"task"` by default).
    pub(crate) fn name(&self) -> &'static str {
        self.identity.name.get()
    }

    /// This coroutine's loop: unique among the loops of the process, never reused.
    pub fn loop_id(&self) -> u64 {
        self.inner.loop_id
    }

    /// What another coroutine of this loop calls [`Co::wake_local`] with to end this one's
    /// [`Co::wait_woken`].
    pub fn local_waker(&self) -> LocalWaker {
        LocalWaker {
            loop_id: self.inner.loop_id,
            key: self.key,
            id: self.id(),
        }
    }

    /// Suspends until a coroutine of this loop wakes us with [`Co::wake_local`] (a
    /// [`crate::WaitQueue`] without the queue: the caller keeps its [`LocalWaker`] where the
    /// waker finds it). Wake-ups are not remembered: check the condition in a loop, and
    /// publish the waker before calling. At shutdown the coroutine is never woken; it is
    /// unwound (the shutdown contract).
    #[inline]
    pub fn wait_woken(&self) {
        self.park(Park::Wait);
    }

    /// Makes the coroutine `waker` names ready, if it runs on this loop and waits in
    /// [`Co::wait_woken`] (or on a wait queue); returns whether it did. A waker of another
    /// loop, of a coroutine that is gone or of one that is not waiting is left alone: `false`.
    pub fn wake_local(&self, waker: LocalWaker) -> bool {
        waker.loop_id == self.inner.loop_id && self.inner.wake(waker.key, waker.id)
    }

    /// Starts the next job of the same worker: its identity, and counters from zero.
    #[inline(always)]
    pub(crate) fn begin(&self, (id, name): (TaskId, &'static str)) {
        self.identity.id.set(id);
        self.identity.name.set(name);
        self.suspends.set(0);
        self.sqes.set(0);
        self.io_wait_ns.set(0);
    }

    pub(crate) fn key(&self) -> usize {
        self.key
    }

    /// Lets every other ready coroutine run once, then continues.
    ///
    /// Inlined, like every function that contains the suspend: a coroutine resumes by
    /// returning out of the frame it suspended in, and each such out-of-line frame costs
    /// a mispredicted return on both switches (about 4x the switch itself, measured).
    #[inline]
    pub fn yield_now(&self) {
        self.park(Park::Yield);
    }

    /// Hands control to the loop until it resumes us. What it resumes an I/O wait with (the
    /// CQE's result) is then in `Inner::resumed_with` (see `park_io`).
    #[inline(always)]
    pub(crate) fn park(&self, why: Park) {
        if self.hook.get().is_some() {
            self.run_first_suspend();
        }
        self.suspends.set(self.suspends.get().wrapping_add(1));
        self.yielder.suspend(why)
    }

    /// Runs `body`; if it suspends (for I/O, on a wait queue, or to yield), `hook` runs
    /// once, on this coroutine, just before the first suspend. Returns what `body`
    /// returned, and whether the hook ran.
    ///
    /// The hook belongs to this coroutine's `Co`: arming happens while it runs, and its
    /// first suspend fires and disarms the hook, so a suspend checks one field of its own.
    ///
    /// A FUSE reader serves the request it read in place, and hands reading over to a new
    /// reader only when serving has to wait: a request served without suspending costs no
    /// spawn and no switch beyond its read.
    ///
    /// ```
    /// let rt = runtime::Runtime::new(Default::default())?;
    /// let (quick, waited) = rt.block_on(|co| {
    ///     let hook = |_: &runtime::Co<'_>| println!("about to wait");
    ///     let quick = co.on_first_suspend(&hook, || 6 * 7);
    ///     let waited = co.on_first_suspend(&hook, || co.ctx().nop().is_ok());
    ///     (quick, waited)
    /// })?;
    /// assert_eq!((quick, waited), ((42, false), (true, true)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn on_first_suspend<R>(
        &self,
        hook: &SuspendHook<'_>,
        body: impl FnOnce() -> R,
    ) -> (R, bool) {
        /// Disarms the hook when `body` returns or unwinds.
        struct Disarm<'c, 'a>(&'c Co<'a>);
        impl Drop for Disarm<'_, '_> {
            fn drop(&mut self) {
                self.0.hook.set(None);
            }
        }
        debug_assert!(self.hook.get().is_none(), "hooks do not nest");
        let armed: NonNull<SuspendHook<'_>> = NonNull::from(hook);
        // SAFETY: only the lifetime bound of the trait object changes; `Disarm` clears the
        // pointer before this call returns or unwinds, so it is never used after `hook`'s
        // borrow ends.
        let armed: NonNull<SuspendHook<'static>> = unsafe { std::mem::transmute(armed) };
        self.hook.set(Some(armed));
        let disarm = Disarm(self);
        let result = body();
        let ran = self.hook.get().is_none();
        drop(disarm);
        (result, ran)
    }

    /// Disarms and runs the hook of [`Co::on_first_suspend`].
    #[cold]
    #[inline(never)]
    fn run_first_suspend(&self) {
        if let Some(hook) = self.hook.take() {
            // SAFETY: armed by `on_first_suspend`, whose caller's borrow of the hook lasts
            // until it disarms it; `take` disarmed it, so the hook runs once.
            unsafe { hook.as_ref()(self) };
        }
    }

    /// Suspends until the CQE of the SQE just queued; counts it, and times it when asked.
    /// Returns the CQE's result, which the loop resumed us with.
    #[inline(always)]
    fn park_io(&self) -> i32 {
        self.sqes.set(self.sqes.get().wrapping_add(1));
        if !self.inner.accounting() {
            self.park(Park::Io);
            return self.inner.resumed_with.get();
        }
        let started = Instant::now();
        self.park(Park::Io);
        let result = self.inner.resumed_with.get();
        let waited = started.elapsed().as_nanos() as u64;
        self.io_wait_ns.set(self.io_wait_ns.get() + waited);
        result
    }

    /// Starts another coroutine on this loop; it first runs after this one suspends. The
    /// same spawn as [`Runtime::spawn`](crate::Runtime::spawn) (one implementation,
    /// `Inner::spawn`, behind both).
    pub fn spawn(&self, f: impl FnOnce(&Co<'_>) + 'static) -> io::Result<TaskId> {
        self.rc.spawn(UNNAMED, f)
    }

    /// Starts a named coroutine (the name appears in logs).
    pub fn spawn_named(
        &self,
        name: &'static str,
        f: impl FnOnce(&Co<'_>) + 'static,
    ) -> io::Result<TaskId> {
        self.rc.spawn(name, f)
    }

    /// Starts a coroutine whose result can be awaited with [`JoinHandle::join`].
    pub fn spawn_joinable<T: 'static>(
        &self,
        f: impl FnOnce(&Co<'_>) -> T + 'static,
    ) -> io::Result<JoinHandle<T>> {
        self.rc.spawn_joinable(UNNAMED, f)
    }

    /// Cancels the I/O that coroutine `id` is suspended on, if any (it resumes with
    /// `ECANCELED`, or with the operation's result if that won the race). Returns whether
    /// `id` was waiting on I/O. Costs one `IORING_OP_ASYNC_CANCEL` SQE and a scan of the
    /// live coroutines: meant for shutdown paths, not per request.
    pub fn cancel_io(&self, id: TaskId) -> io::Result<bool> {
        self.inner.cancel_io(id)
    }

    /// A copy of the loop's counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.inner.counters()
    }

    /// Submits any prepared SQE (the ring side of [`Ctx::submit`], which is how code outside
    /// the runtime reaches it) and suspends until its completion; returns
    /// the CQE's `res` (negative errno on failure). The SQE's `user_data` is overwritten.
    /// Fails with `ECANCELED`, without submitting, once the runtime is shutting down.
    ///
    /// # Safety
    /// - Everything the SQE points to must stay valid until this call returns. Memory owned
    ///   by this coroutine (its stack, or borrowed for the call) satisfies this: the loop
    ///   never frees a coroutine's stack while its SQE is in flight, even at shutdown.
    /// - The SQE must produce exactly one CQE: no multishot operations, no
    ///   `IOSQE_CQE_SKIP_SUCCESS`, no linked chains (`IO_LINK`, `IO_HARDLINK`).
    #[inline(always)]
    pub(crate) unsafe fn submit(&self, entry: squeue::Entry) -> io::Result<i32> {
        if self.inner.is_closing() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let entry = entry.user_data(self.key as u64);
        // SAFETY: forwarded from the caller; we suspend until the CQE arrives.
        unsafe { self.inner.push_sqe(&entry)? };
        Ok(self.park_io())
    }

    /// As [`Co::submit`], for a 128-byte SQE (`IORING_OP_URING_CMD`); the runtime must have
    /// been built with [`Config::sqe128`](crate::Config::sqe128).
    ///
    /// # Safety
    /// As [`Co::submit`].
    #[inline]
    pub(crate) unsafe fn submit128(&self, entry: squeue::Entry128) -> io::Result<i32> {
        if self.inner.is_closing() {
            return Err(io::Error::from_raw_os_error(libc::ECANCELED));
        }
        let entry = entry.user_data(self.key as u64);
        // SAFETY: forwarded from the caller; we suspend until the CQE arrives.
        unsafe { self.inner.push_sqe128(&entry)? };
        Ok(self.park_io())
    }
}
