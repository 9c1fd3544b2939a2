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
use crate::job::Job;
use crate::resume::panic_message;
use crate::task::{Coro, Slot, State};
use crate::worker::{END, START};

impl Inner {
    pub(crate) fn shutdown(&self) -> io::Result<()> {
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
