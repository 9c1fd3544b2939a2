//! Resuming: the loop switches into a coroutine (in place in its slot, inside
//! `catch_unwind`) and books how it came back: it yielded, parked on I/O or on a queue, its
//! job returned (its worker goes idle, and idle workers beyond the pool's bound end), or it
//! panicked (its worker ends; the loop goes on).
//!
//! It is apart from the loop because the loop and both fast paths resume coroutines the
//! same way, and ending a worker belongs with the resume that finds it done.

use std::panic::{self, AssertUnwindSafe};
use std::ptr::NonNull;

use corosensei::CoroutineResult;

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
