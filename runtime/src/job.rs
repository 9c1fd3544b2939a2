//! A spawned closure waiting in the job queue: stored inline, so a spawn allocates nothing.
//!
//! A [`Job`] is the coroutine's identity (id and name) and a fixed-size buffer of [`JOB_BYTES`] bytes (16-byte aligned) plus one function
//! pointer that knows the closure's type. A closure that fits is written into the buffer; a
//! larger or more aligned one is boxed and the box is stored instead (the runtime counts
//! those, as `jobs_boxed`, so a hot path can be checked never to take it).
//!
//! # Contract
//! - A slot holds at most one job: [`Job::put`] only into an empty slot.
//! - [`Job::run`] moves the closure onto the caller's stack before calling it, so the slot is
//!   empty while the closure runs, and stays empty if it panics.
//! - Dropping a slot that still holds a job drops the closure without running it.

use std::mem::{align_of, size_of, MaybeUninit};

use crate::co::Co;
use crate::task::TaskId;

/// Bytes of closure stored inline; larger closures are boxed.
pub(crate) const JOB_BYTES: usize = 64;

#[repr(C, align(16))]
struct Buf(MaybeUninit<[u8; JOB_BYTES]>);

/// Reads the closure out of the buffer, then calls it with `Some(co)` or drops it with `None`.
type CallFn = unsafe fn(*mut Buf, Option<&Co<'_>>);

pub(crate) struct Job {
    call: Option<CallFn>,
    id: TaskId,
    name: &'static str,
    buf: Buf,
}

/// Whether `F` is stored inline.
const fn fits<F>() -> bool {
    size_of::<F>() <= JOB_BYTES && align_of::<F>() <= align_of::<Buf>()
}

impl Job {
    pub(crate) const fn empty() -> Job {
        Job {
            call: None,
            id: TaskId(0),
            name: "",
            buf: Buf(MaybeUninit::uninit()),
        }
    }

    /// Stores `f` as the job of coroutine `id` called `name`; returns whether it had to be
    /// boxed.
    #[inline(always)]
    pub(crate) fn put<F: FnOnce(&Co<'_>) + 'static>(
        &mut self,
        id: TaskId,
        name: &'static str,
        f: F,
    ) -> bool {
        debug_assert!(self.call.is_none(), "a job slot holds one job");
        self.id = id;
        self.name = name;
        if fits::<F>() {
            // SAFETY: the buffer is large and aligned enough for `F` (`fits`), and empty.
            unsafe { self.buf.0.as_mut_ptr().cast::<F>().write(f) };
            self.call = Some(call::<F>);
            false
        } else {
            // SAFETY: a `Box` is one pointer, which always fits; the buffer is empty.
            unsafe { self.buf.0.as_mut_ptr().cast::<Box<F>>().write(Box::new(f)) };
            self.call = Some(call::<Box<F>>);
            true
        }
    }

    /// Whether a job waits here.
    #[cfg(test)]
    pub(crate) fn is_pending(&self) -> bool {
        self.call.is_some()
    }

    /// The identity of the coroutine whose job this is.
    ///
    /// # Safety
    /// `job` points to a live `Job` that nothing else accesses during the call.
    #[inline(always)]
    pub(crate) unsafe fn identity(job: *const Job) -> (TaskId, &'static str) {
        // SAFETY: forwarded from the caller.
        let job = unsafe { &*job };
        (job.id, job.name)
    }

    /// Takes the job out and runs it with `co`; does nothing if the slot is empty.
    ///
    /// # Safety
    /// `job` points to a live `Job`, and nothing else accesses it until the closure has been
    /// moved out (after that, the slot may be refilled while the closure still runs).
    #[inline(always)]
    pub(crate) unsafe fn run(job: *mut Job, co: &Co<'_>) {
        // SAFETY: forwarded from the caller; the reference ends before the closure runs.
        if let Some(call) = unsafe { (*job).call.take() } {
            // SAFETY: `call` matches the closure in the buffer, which it moves out first.
            unsafe { call(&raw mut (*job).buf, Some(co)) };
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // SAFETY: `call` matches the closure in the buffer; `None` drops it unrun.
            unsafe { call(&raw mut self.buf, None) };
        }
    }
}

/// The [`CallFn`] of closures of type `F`.
///
/// # Safety
/// `buf` holds an `F` written by [`Job::put`], which this moves out: call it once.
unsafe fn call<F: FnOnce(&Co<'_>)>(buf: *mut Buf, co: Option<&Co<'_>>) {
    // SAFETY: forwarded from the caller.
    let f = unsafe { buf.cast::<F>().read() };
    match co {
        Some(co) => f(co),
        None => drop(f),
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    #[test]
    fn small_closures_are_inline_and_large_ones_boxed() {
        let small = [0u64; JOB_BYTES / 8];
        let large = [0u64; JOB_BYTES / 8 + 1];
        let mut job = Job::empty();
        assert!(!job.put(TaskId(1), "small", move |_| {
            std::hint::black_box(small);
        }));
        drop(job);
        let mut job = Job::empty();
        assert!(job.put(TaskId(2), "large", move |_| {
            std::hint::black_box(large);
        }));
        assert!(job.is_pending());
        // SAFETY: `job` is a local, not otherwise accessed.
        assert_eq!(unsafe { Job::identity(&job) }, (TaskId(2), "large"));
    }

    #[test]
    fn a_job_dropped_unrun_drops_its_closure() {
        fn check<F: FnOnce(&Co<'_>) + 'static>(witness: &Rc<()>, make: impl FnOnce(Rc<()>) -> F) {
            let mut job = Job::empty();
            job.put(TaskId(1), "witness", make(witness.clone()));
            assert_eq!(Rc::strong_count(witness), 2);
            drop(job);
            assert_eq!(Rc::strong_count(witness), 1);
        }
        let witness = Rc::new(());
        check(&witness, |w| move |_: &Co<'_>| drop(w));
        let pad = [0u8; JOB_BYTES];
        check(&witness, |w| move |_: &Co<'_>| drop((w, pad)));
    }
}
