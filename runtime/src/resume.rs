//! Resuming: the loop switches into a coroutine (in place in its slot) and books how it
//! came back: it yielded, parked on I/O or on a queue, its job returned (its worker goes
//! idle, and idle workers beyond the pool's bound end), or its worker returned because its
//! job panicked (the worker caught and reported the panic; the loop ends the worker and
//! goes on).
//!
//! No `catch_unwind` here: each worker catches its jobs' panics once, at its entry (see
//! `worker`), so a resume is the switch and a compare, and nothing unwinds into the loop.
//! The arms taken on every switch (a yield, an I/O wait) and on every job's end are tested
//! with plain compares (a jump table over all five cost five more instructions per switch).
//!
//! It is apart from the loop because the loop and both fast paths resume coroutines the
//! same way, and ending a worker belongs with the resume that finds it done.

use std::ptr::NonNull;

use corosensei::CoroutineResult;

use crate::co::Co;
use crate::executor::Inner;
use crate::task::{Coro, Park, State};
use crate::worker::END;

/// How a coroutine came back to the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Back {
    /// It yielded: it is to be queued again.
    Yielded,
    /// It waits for the CQE of its SQE.
    Io,
    /// It waits on a queue, or its job ended, or it panicked.
    Other,
}

impl Inner {
    /// Switches into one coroutine, in place in its slot, and books how it came back.
    /// When it yielded (`Park::Yield`), the caller queues it.
    #[inline(always)]
    pub(crate) fn run_task(&self, key: usize, value: i32) -> Back {
        self.run_in(self.coros.with(|coros| coros.slot(key)), key, value)
    }

    /// [`Inner::run_task`] with the slot of `key` already looked up.
    #[inline(always)]
    pub(crate) fn run_in(&self, slot: NonNull<Option<Coro>>, key: usize, value: i32) -> Back {
        match self.resume_in(slot, value) {
            CoroutineResult::Yield(Park::Yield) => {
                self.counters.suspends.bump();
                Back::Yielded
            }
            CoroutineResult::Yield(Park::Io) => {
                self.counters.suspends.bump();
                self.sched.with(|s| {
                    // SAFETY: the key of the coroutine just resumed.
                    unsafe { s.slot_unchecked(key) }.state = State::Io;
                });
                Back::Io
            }
            CoroutineResult::Yield(Park::Done) => {
                self.retire(key);
                Back::Other
            }
            other => self.came_back(key, other),
        }
    }

    /// [`Inner::run_in`] for a coroutine that is expected back on I/O again (`wait_alone`):
    /// that way back is one compare, and every other is booked out of line (`came_back`).
    /// Inline, `run_in`'s three compares became a jump table there.
    #[inline(always)]
    pub(crate) fn run_in_for_io(
        &self,
        slot: NonNull<Option<Coro>>,
        key: usize,
        value: i32,
    ) -> Back {
        match self.resume_in(slot, value) {
            CoroutineResult::Yield(Park::Io) => {
                self.counters.suspends.bump();
                self.sched.with(|s| {
                    // SAFETY: the key of the coroutine just resumed.
                    unsafe { s.slot_unchecked(key) }.state = State::Io;
                });
                Back::Io
            }
            other => self.came_back(key, other),
        }
    }

    /// Resumes the coroutine in `slot` with `value`, counted.
    #[inline(always)]
    fn resume_in(&self, slot: NonNull<Option<Coro>>, value: i32) -> CoroutineResult<Park, ()> {
        self.counters.resumes.bump();
        // SAFETY: the slot's address is stable for the store's life (see `CoroStore`), and
        // while this coroutine runs nothing else touches its slot: only `retire` and `end`
        // take it out, after `resume` has returned.
        let co = unsafe { &mut *slot.as_ptr() }
            .as_mut()
            .expect("a ready coroutine is in its slot");
        self.resumed_with.set(value);
        co.resume(())
    }

    /// The rarer ways back: the coroutine waits on a queue, or its worker returned (its
    /// job panicked). Out of line, so that the compiler keeps the three compares above
    /// instead of folding every arm back into one jump table (five instructions more on
    /// every switch).
    ///
    /// `run_alone` books every way back but a yield here too, once its coroutine is back
    /// in its slot, and `run_in_for_io` every way back but an I/O wait.
    #[inline(never)]
    pub(crate) fn came_back(&self, key: usize, how: CoroutineResult<Park, ()>) -> Back {
        match how {
            CoroutineResult::Yield(Park::Wait) => {
                self.counters.suspends.bump();
                self.sched.with(|s| s.tasks[key].state = State::Waiting);
                Back::Other
            }
            CoroutineResult::Yield(Park::Io) => {
                self.counters.suspends.bump();
                self.sched.with(|s| s.tasks[key].state = State::Io);
                Back::Io
            }
            CoroutineResult::Yield(Park::Done) => {
                self.retire(key);
                Back::Other
            }
            CoroutineResult::Yield(Park::Yield) => {
                self.counters.suspends.bump();
                Back::Yielded
            }
            CoroutineResult::Return(()) => {
                self.ended_by_panic(key);
                Back::Other
            }
        }
    }

    /// Ends the worker at `key`, which returned because its job panicked (it has booked and
    /// reported the panic, see `worker`): frees the slot and pools the stack.
    #[cold]
    #[inline(never)]
    fn ended_by_panic(&self, key: usize) {
        let co = self.coros.with(|coros| coros.take(key));
        self.end(key, co.expect("a panicked coroutine is in its slot"));
    }

    /// Books the panic of the job of the worker whose `Co` is `co` (called by that worker,
    /// on its own stack, where it caught the panic): counts it and logs it with the job's
    /// identity. The worker then returns, and the loop ends it (`ended_by_panic`).
    #[cold]
    #[inline(never)]
    pub(crate) fn panicked(&self, co: &Co<'_>, payload: Box<dyn std::any::Any + Send>) {
        self.counters.finished(true);
        log::error!(
            "coroutine {} ({}) panicked: {}; the loop goes on",
            co.id(),
            co.name(),
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
        while let Some(key) = self.stacks.with(|pool| pool.pop_over_bound()) {
            self.end_idle(key);
        }
    }

    /// Ends the idle worker at `key`: resumed with [`END`], it returns.
    fn end_idle(&self, key: usize) {
        let mut co = self
            .coros
            .with(|coros| coros.take(key))
            .expect("an idle worker is in its slot");
        self.resumed_with.set(END);
        let ended = co.resume(());
        debug_assert!(matches!(ended, CoroutineResult::Return(())));
        self.end(key, co);
    }

    /// Pools the stack of a worker that has ended, and frees its key (forgetting the
    /// identity its `Co` held).
    fn end(&self, key: usize, co: Coro) {
        self.stacks
            .with(|pool| pool.give(co.into_stack().into_inner()));
        self.sched.with(|s| {
            s.release(key);
            s.no_worker.push(key);
        });
    }
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
