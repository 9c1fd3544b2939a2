//! Worker coroutines: one corosensei coroutine runs job after job, as QEMU's coroutine pool
//! does, so a pooled spawn is a pop, a resume and a push instead of building and tearing
//! down a coroutine; and a worker whose job returns takes the next queued job itself, with
//! no switch at all, when that job is next in the loop's turn.
//!
//! # Contract with the loop (`executor`)
//! - A worker is bound to one key for its whole life; when it first runs it registers its
//!   [`Co`]'s identity with that key's slot (read in place by the loop from then on).
//! - It is resumed with [`START`] when the loop reaches a start entry in the run queue and
//!   chose this idle worker for it: it takes that entry's job ([`Inner::started_job`]),
//!   runs it with its [`Co`] reset (the job's identity, and per-coroutine counters from
//!   zero), and counts it completed. Yields in between are the job's own.
//! - It then asks the loop for the next job of the same turn ([`Inner::chain_job`]): if the
//!   next ready entry is a start, it pops it and runs its job in place (the order the loop
//!   would have run it in, without the two switches); otherwise it suspends with
//!   [`Park::Done`].
//! - Resumed with [`END`] (idle, or never started), it returns: that is how the loop ends
//!   an idle worker.
//! - A panic in a job ends the worker: it unwinds to corosensei's root and resumes on the
//!   loop's side, which drops the worker and keeps only its stack. A forced unwind (dropping
//!   a worker suspended inside a job, at shutdown) ends it the same way.

use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;

use corosensei::{Coroutine, Yielder};

use crate::co::Co;
use crate::colored_stack::ColoredStack;
use crate::executor::Inner;
use crate::job::Job;
use crate::task::{Coro, Park};

/// Resume value that starts a worker on the job queue's oldest job: never a CQE's result
/// (at least -4095) nor a yield's or wake's (0), so a run queue entry with it is a start.
pub(crate) const START: i32 = i32::MIN + 1;
/// Resume value that ends an idle worker.
pub(crate) const END: i32 = i32::MIN;

/// A new idle worker for `key` on `stack`.
pub(crate) fn worker(stack: ColoredStack, inner: Rc<Inner>, key: usize) -> Coro {
    Coroutine::with_stack(stack, move |yielder, ()| {
        let first = inner.resumed_with.get();
        // One `Co` for every job of this worker, reset for each (`begin`).
        let co = Co::new(yielder, &inner, key);
        inner.sched.with(|s| s.register(key, &co.identity));
        let served = panic::catch_unwind(AssertUnwindSafe(|| serve(&inner, &co, yielder, first)));
        if let Err(payload) = served {
            if inner.is_closing() {
                // Shutdown's forced unwind of this worker (see the module's contract):
                // corosensei's root must see its own payload to finish the drop.
                panic::resume_unwind(payload);
            }
            inner.panicked(&co, payload);
        }
    })
}

/// The worker's life: job after job until it is resumed with [`END`].
#[inline(always)]
fn serve(inner: &Inner, co: &Co<'_>, yielder: &Yielder<(), Park>, first: i32) {
    let mut command = first;
    while command != END {
        let mut job = inner.started_job();
        loop {
            // SAFETY: the start entry of `job` was just popped and nothing has spawned
            // since (see `RunQueue`); `run` reads the job out before calling the closure.
            unsafe {
                co.begin(Job::identity(job.as_ptr()));
                Job::run(job.as_ptr(), co);
            }
            inner.counters.finished(false);
            match inner.chain_job() {
                Some(next) => job = next,
                None => break,
            }
        }
        yielder.suspend(Park::Done);
        command = inner.resumed_with.get();
    }
}
