//! A spawned closure waiting in the run queue: stored inline, so a spawn allocates nothing.
//!
//! A [`Job`] is the coroutine's identity (id and name), a pointer to the two functions that
//! know the closure's type (run it, or drop it unrun: one static table per closure type,
//! so a start calls its closure without testing which of the two it wants), and a buffer
//! of [`JOB_BYTES`] bytes (16-byte aligned). A closure that fits is written into the
//! buffer; a larger or more aligned one is boxed and the box is stored instead (the
//! runtime counts those, as `jobs_boxed`, so a hot path can be checked never to take it).
//!
//! A `Job` has no "empty" state and no destructor: it lives in the run queue's job slots
//! (`MaybeUninit`), which know which slots hold one (those of queued start entries). Taking
//! it out either runs it ([`Job::run`]) or drops it unrun ([`PendingJob`]); neither writes
//! the slot back, so a start costs no store to mark the slot empty.
//!
//! # Contract
//! - [`Job::write`] only into a slot that holds no job.
//! - [`Job::run`] reads the whole job (the closure moved onto the caller's stack) before
//!   calling the closure: from then on the slot may be reused, also while the closure runs.

use std::mem::{align_of, size_of, MaybeUninit};

use crate::co::Co;
use crate::task::TaskId;

/// Bytes of closure stored inline; larger closures are boxed. 96 makes a [`Job`] 128 bytes,
/// so that the run queue finds a job's slot with one shift (callgrind: one instruction
/// fewer at a spawn and at a chained start than with 64, whose 96-byte jobs cost a
/// multiply by 3 too); job slots are touched only under start entries.
pub(crate) const JOB_BYTES: usize = 96;

#[repr(C, align(16))]
struct Buf(MaybeUninit<[u8; JOB_BYTES]>);

/// What a job's closure type knows: reading the closure out of the buffer, then calling it
/// with `co`, or dropping it unrun.
struct Calls {
    run: unsafe fn(*mut Buf, &Co<'_>),
    drop: unsafe fn(*mut Buf),
}

impl Calls {
    /// The table of closures of type `F`.
    const fn of<F: FnOnce(&Co<'_>)>() -> &'static Calls {
        const {
            &Calls {
                run: run::<F>,
                drop: drop_unrun::<F>,
            }
        }
    }
}

// One cache-line pair per job, and a power of two (see `JOB_BYTES`).
const _: () = assert!(size_of::<Job>() == 128);

pub(crate) struct Job {
    calls: &'static Calls,
    id: TaskId,
    name: &'static str,
    buf: Buf,
}

/// Whether `F` is stored inline.
const fn fits<F>() -> bool {
    size_of::<F>() <= JOB_BYTES && align_of::<F>() <= align_of::<Buf>()
}

impl Job {
    /// Writes `f`, the job of coroutine `id` called `name`, into `slot`, field by field (no
    /// copy of the buffer); returns whether `f` had to be boxed.
    ///
    /// # Safety
    /// `slot` is valid for writes and holds no job (whatever it holds is overwritten, not
    /// dropped).
    #[inline(always)]
    pub(crate) unsafe fn write<F: FnOnce(&Co<'_>) + 'static>(
        slot: *mut Job,
        id: TaskId,
        name: &'static str,
        f: F,
    ) -> bool {
        // SAFETY: `slot` is valid for writes (the caller); each field is written in place,
        // the buffer is large and aligned enough for `F` (`fits`) or for a `Box`.
        unsafe {
            (&raw mut (*slot).id).write(id);
            (&raw mut (*slot).name).write(name);
            let buf = (&raw mut (*slot).buf).cast::<u8>();
            if fits::<F>() {
                buf.cast::<F>().write(f);
                (&raw mut (*slot).calls).write(Calls::of::<F>());
                false
            } else {
                buf.cast::<Box<F>>().write(Box::new(f));
                (&raw mut (*slot).calls).write(Calls::of::<Box<F>>());
                true
            }
        }
    }

    /// The identity of the coroutine whose job this is.
    ///
    /// # Safety
    /// `job` points to a job written by [`Job::write`] and not yet taken out.
    #[inline(always)]
    pub(crate) unsafe fn identity(job: *const Job) -> (TaskId, &'static str) {
        // SAFETY: forwarded from the caller.
        unsafe { ((*job).id, (*job).name) }
    }

    /// Takes the job out of its slot and runs it with `co`.
    ///
    /// # Safety
    /// `job` points to a job written by [`Job::write`] and not yet taken out; this takes it
    /// out (the slot holds no job afterwards).
    #[inline(always)]
    pub(crate) unsafe fn run(job: *mut Job, co: &Co<'_>) {
        // SAFETY: forwarded from the caller; `run` matches the closure in the buffer and
        // moves it out before calling it.
        unsafe { ((*job).calls.run)(&raw mut (*job).buf, co) };
    }

    /// Takes the job out of its slot, to be dropped unrun.
    ///
    /// # Safety
    /// As [`Job::run`].
    pub(crate) unsafe fn take(job: *mut Job) -> PendingJob {
        // SAFETY: forwarded from the caller: the job is moved out, and its slot is treated
        // as empty from now on, so it is owned once.
        PendingJob(unsafe { job.read() })
    }
}

/// A job taken out of the run queue without running (shutdown): dropping it drops the
/// closure unrun.
pub(crate) struct PendingJob(Job);

impl PendingJob {
    /// The identity of the coroutine whose job this is.
    #[cfg(test)]
    pub(crate) fn identity(&self) -> (TaskId, &'static str) {
        (self.0.id, self.0.name)
    }
}

impl Drop for PendingJob {
    fn drop(&mut self) {
        // SAFETY: `drop` matches the closure in the buffer, which is still there (a
        // `PendingJob` is never run); this drops it, once.
        unsafe { (self.0.calls.drop)(&raw mut self.0.buf) };
    }
}

/// Runs the closure of type `F` in `buf` with `co`.
///
/// # Safety
/// `buf` holds an `F` written by [`Job::write`], which this moves out: call it (or
/// [`drop_unrun`]) once.
unsafe fn run<F: FnOnce(&Co<'_>)>(buf: *mut Buf, co: &Co<'_>) {
    // SAFETY: forwarded from the caller.
    let f = unsafe { buf.cast::<F>().read() };
    f(co)
}

/// Drops the closure of type `F` in `buf` unrun.
///
/// # Safety
/// As [`run`].
unsafe fn drop_unrun<F: FnOnce(&Co<'_>)>(buf: *mut Buf) {
    // SAFETY: forwarded from the caller.
    drop(unsafe { buf.cast::<F>().read() });
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    /// A job written into a fresh slot and taken out unrun.
    fn pending<F: FnOnce(&Co<'_>) + 'static>(
        id: u64,
        name: &'static str,
        f: F,
    ) -> (PendingJob, bool) {
        let mut slot = MaybeUninit::<Job>::uninit();
        // SAFETY: a fresh local slot, written once and taken out once.
        unsafe {
            let boxed = Job::write(slot.as_mut_ptr(), TaskId(id), name, f);
            (Job::take(slot.as_mut_ptr()), boxed)
        }
    }

    #[test]
    fn small_closures_are_inline_and_large_ones_boxed() {
        let small = [0u64; JOB_BYTES / 8];
        let large = [0u64; JOB_BYTES / 8 + 1];
        let (_, boxed) = pending(1, "small", move |_| {
            std::hint::black_box(small);
        });
        assert!(!boxed);
        let (job, boxed) = pending(2, "large", move |_| {
            std::hint::black_box(large);
        });
        assert!(boxed);
        assert_eq!(job.identity(), (TaskId(2), "large"));
    }

    #[test]
    fn a_job_dropped_unrun_drops_its_closure() {
        let witness = Rc::new(());
        let w = witness.clone();
        let (inline, _) = pending(1, "inline", move |_| drop(w));
        let w = witness.clone();
        let pad = [0u8; JOB_BYTES];
        let (boxed, _) = pending(2, "boxed", move |_| drop((w, pad)));
        assert_eq!(Rc::strong_count(&witness), 3);
        drop((inline, boxed));
        assert_eq!(Rc::strong_count(&witness), 1);
    }
}
