//! Worker coroutines: one corosensei coroutine runs job after job, as QEMU's coroutine pool
//! does, so a pooled spawn is a pop, a resume and a push instead of building and tearing
//! down a coroutine.
//!
//! # Contract with the loop (`executor`)
//! - A worker is bound to one key for its whole life; its job slot is the `CoroStore` entry
//!   of that key. The loop writes the slot only while the worker is idle: not started yet,
//!   or suspended with [`Park::Done`].
//! - Resumed with a job in its slot, the worker takes it out, runs it with a fresh [`Co`]
//!   (so per-coroutine counters start at zero for every job), then suspends with
//!   [`Park::Done`]. Yields in between are the job's own.
//! - Resumed with an empty slot, it returns: that is how the loop ends an idle worker.
//! - A panic in a job ends the worker: it unwinds to corosensei's root and resumes on the
//!   loop's side, which drops the worker and keeps only its stack. A forced unwind (dropping
//!   a worker suspended inside a job, at shutdown) ends it the same way.

use std::ptr::NonNull;
use std::rc::Rc;

use corosensei::stack::DefaultStack;
use corosensei::Coroutine;

use crate::co::Co;
use crate::executor::Inner;
use crate::job::Job;
use crate::task::{Coro, Park};

/// A new worker for `key` on `stack`, taking its jobs from `job`.
pub(crate) fn worker(stack: DefaultStack, inner: Rc<Inner>, key: usize, job: NonNull<Job>) -> Coro {
    Coroutine::with_stack(stack, move |yielder, _first: i32| {
        // SAFETY: the job slot lives as long as the store, which outlives every worker
        // (shutdown ends them all first), and the loop leaves it alone while we run.
        while let Some(id) = unsafe { Job::pending(job.as_ptr()) } {
            let co = Co::new(yielder, &inner, key, id);
            // SAFETY: as above.
            unsafe { Job::run(job.as_ptr(), &co) };
            yielder.suspend(Park::Done);
        }
    })
}
