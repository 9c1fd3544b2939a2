//! Shutdown: what a [`Runtime`](crate::Runtime) does with the coroutines still alive when it
//! stops for good. It is apart from the loop because it is a contract with the kernel about
//! buffers, not a turn.
//!
//! # Shutdown contract
//! Dropping a [`Runtime`](crate::Runtime) (or calling
//! [`Runtime::shutdown`](crate::Runtime::shutdown)) with coroutines alive:
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

use std::io;
use std::panic::{self, AssertUnwindSafe};

use crate::executor::Inner;
use crate::job::PendingJob;
use crate::resume::panic_message;
use crate::sched::identity;
use crate::task::{Coro, State, TaskId};
use crate::worker::END;

/// A worker taken out at shutdown: its state, its job's identity, and the worker.
type Taken = (State, (TaskId, &'static str), Coro);

impl Inner {
    pub(crate) fn shutdown(&self) -> io::Result<()> {
        if self.running.get() {
            return Err(io::Error::other(
                "shutdown from inside the running loop; stop the loop first",
            ));
        }
        self.closing.set(true);
        // Spawns are refused from now on: with no spare worker, each takes the slow path,
        // which checks `closing`.
        self.stacks.with(|pool| pool.close());
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
        for (state, (id, name), co) in workers {
            let ended = panic::catch_unwind(AssertUnwindSafe(|| self.end_at_shutdown(state, co)));
            if let Err(payload) = ended {
                log::error!(
                    "coroutine {id} ({name}) panicked while unwinding at shutdown: {}",
                    panic_message(&*payload)
                );
            }
        }
        Ok(())
    }

    /// Every job that never started, and every remaining worker with its state and
    /// identity, read while every worker still lives (idle workers, promised or not, come
    /// with a free state); leaves the loop empty, every slot released.
    fn take_all(&self) -> (Vec<PendingJob>, Vec<Taken>) {
        let idle = self.stacks.with(|pool| pool.take_idle());
        let (jobs, slots) = self.sched.with(|s| {
            let jobs = s.ready.drain();
            let live = s.live_keys(|_| true).into_iter();
            let keys = live.chain(idle);
            let slots: Vec<_> = keys
                .map(|k| {
                    let slot = s.release(k);
                    (k, slot.state, identity(&slot))
                })
                .collect();
            (jobs, slots)
        });
        self.counters.dropped_unrun.add(jobs.len() as u64);
        let workers = self.coros.with(|coros| {
            let taken = slots.into_iter();
            taken
                .filter_map(|(key, state, who)| Some((state, who, coros.take(key)?)))
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

impl Inner {
    /// Ends a worker at shutdown: an idle one (or one never started), resumed with [`END`],
    /// returns; one suspended inside its job is dropped, which unwinds its stack.
    fn end_at_shutdown(&self, state: State, mut co: Coro) {
        if state == State::Free {
            self.resumed_with.set(END);
            co.resume(());
        }
        drop(co);
    }
}
