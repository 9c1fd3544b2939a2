//! The io_uring of one event loop: queue SQEs, enter the kernel once per loop turn, reap.
//!
//! # Contract
//! - Every SQE pushed here carries the slab key of the coroutine that waits for it as
//!   `user_data`, or [`INTERNAL`] for the loop's own bookkeeping SQEs (cancellations), whose
//!   completions are dropped. Each SQE must produce exactly one CQE.
//! - `in_flight` counts pushed SQEs whose CQE has not been reaped. The loop never frees or
//!   reuses a coroutine stack while that coroutine has an SQE in flight, because the SQE
//!   may point into that stack.
//! - Pushing never enters the kernel unless the submission queue is full (then it flushes);
//!   the loop enters once per turn: batching in the spirit of QEMU's plug/unplug.

use std::cell::Cell;
use std::io;

use io_uring::{cqueue, squeue, IoUring};

use crate::counters::Counters;
use crate::loop_cell::LoopCell;

/// `user_data` of SQEs whose completion nobody waits for.
pub(crate) const INTERNAL: u64 = u64::MAX;

/// The ring, with 64-byte or 128-byte SQEs (the latter for `IORING_OP_URING_CMD`).
enum Ring {
    Sqe64(IoUring<squeue::Entry, cqueue::Entry>),
    Sqe128(IoUring<squeue::Entry128, cqueue::Entry>),
}

pub(crate) struct Reactor {
    ring: LoopCell<Ring>,
    in_flight: Cell<usize>,
}

impl Reactor {
    pub(crate) fn new(entries: u32, sqe128: bool) -> io::Result<Self> {
        let ring = if sqe128 {
            Ring::Sqe128(
                IoUring::builder()
                    .setup_cqsize(entries * 2)
                    .setup_single_issuer()
                    .build(entries)?,
            )
        } else {
            Ring::Sqe64(
                IoUring::builder()
                    .setup_cqsize(entries * 2)
                    .setup_single_issuer()
                    .build(entries)?,
            )
        };
        Ok(Reactor {
            ring: LoopCell::new(ring),
            in_flight: Cell::new(0),
        })
    }

    /// SQEs pushed whose completion has not been reaped yet.
    #[inline(always)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Queues one SQE; `false` when the submission queue is full (flush, then try again).
    ///
    /// # Safety
    /// Whatever memory `entry` points to must stay valid until its CQE has been reaped.
    #[inline(always)]
    pub(crate) unsafe fn try_push(&self, entry: &squeue::Entry) -> bool {
        let pushed = self.ring.with(|ring| match ring {
            // SAFETY: the caller keeps the entry's memory valid until its completion.
            Ring::Sqe64(ring) => unsafe { ring.submission().push(entry).is_ok() },
            // SAFETY: as above.
            Ring::Sqe128(ring) => unsafe { push_widened(ring, entry) },
        });
        if pushed {
            self.in_flight.set(self.in_flight.get() + 1);
        }
        pushed
    }

    /// Queues one 128-byte SQE (ring built with `sqe128`); `Ok(false)` when full.
    ///
    /// # Safety
    /// As [`Reactor::try_push`].
    pub(crate) unsafe fn try_push128(&self, entry: &squeue::Entry128) -> io::Result<bool> {
        let pushed = self.ring.with(|ring| match ring {
            Ring::Sqe64(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "128-byte SQE on a ring built without Config::sqe128",
            )),
            // SAFETY: the caller keeps the entry's memory valid until its completion.
            Ring::Sqe128(ring) => Ok(unsafe { ring.submission().push(entry).is_ok() }),
        })?;
        if pushed {
            self.in_flight.set(self.in_flight.get() + 1);
        }
        Ok(pushed)
    }

    /// Submits what is queued and waits for at least `want` completions: one
    /// `io_uring_enter`. Skipped when there is nothing to submit and nothing to wait for.
    /// EINTR, EAGAIN and EBUSY are not errors (the loop reaps and looks again). Always
    /// inlined: out of line, its frame cost a NOP round trip more than its body.
    #[inline(always)]
    pub(crate) fn enter(&self, want: usize, counters: &Counters) -> io::Result<()> {
        if want == 0 && self.queued() == 0 {
            return Ok(());
        }
        let result = self.ring.with(|ring| match ring {
            Ring::Sqe64(r) => r.submit_and_wait(want),
            Ring::Sqe128(r) => r.submit_and_wait(want),
        });
        counters.enter_calls.bump();
        match result {
            Ok(submitted) => {
                counters.sqes_submitted.add(submitted as u64);
                Ok(())
            }
            Err(e) => enter_failed(e, self.queued()),
        }
    }

    /// SQEs pushed but not yet submitted: the submission queue's length, which only
    /// `io_uring_enter` shortens (no SQ polling thread), by what it returns as submitted.
    /// Read from the ring rather than counted beside it, so a push writes one count
    /// (`in_flight`) and a wait none.
    #[inline(always)]
    fn queued(&self) -> usize {
        self.ring.with(|ring| match ring {
            Ring::Sqe64(r) => r.submission().len(),
            Ring::Sqe128(r) => r.submission().len(),
        })
    }

    /// Whether a completion is waiting to be reaped (no system call).
    pub(crate) fn has_completions(&self) -> bool {
        self.ring.with(|ring| match ring {
            Ring::Sqe64(r) => !r.completion().is_empty(),
            Ring::Sqe128(r) => !r.completion().is_empty(),
        })
    }

    /// Hands every available completion to `f` as `(user_data, result)`; returns how many.
    /// `f` runs inside the ring's `LoopCell`: it must not touch the reactor, switch
    /// coroutines or run user code.
    #[inline(always)]
    pub(crate) fn reap(&self, counters: &Counters, mut f: impl FnMut(u64, i32)) -> usize {
        let mut n = 0;
        let mut each = |user_data: u64, result: i32| {
            n += 1;
            f(user_data, result)
        };
        self.ring.with(|ring| match ring {
            Ring::Sqe64(r) => r.completion().for_each(|c| each(c.user_data(), c.result())),
            Ring::Sqe128(r) => r.completion().for_each(|c| each(c.user_data(), c.result())),
        });
        self.in_flight.set(self.in_flight.get() - n);
        counters.cqes_reaped.add(n as u64);
        n
    }
}

/// Pushes a 64-byte SQE onto a ring of 128-byte ones (kept out of the 64-byte fast path).
///
/// # Safety
/// As [`Reactor::try_push`].
#[cold]
#[inline(never)]
unsafe fn push_widened(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    entry: &squeue::Entry,
) -> bool {
    let big: squeue::Entry128 = entry.clone().into();
    // SAFETY: forwarded from the caller; the 128-byte form carries the same pointers.
    unsafe { ring.submission().push(&big).is_ok() }
}

/// What a failed `io_uring_enter` means: EINTR, EAGAIN and EBUSY are not errors.
#[cold]
#[inline(never)]
fn enter_failed(e: io::Error, queued: usize) -> io::Result<()> {
    match e.raw_os_error() {
        Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => Ok(()),
        _ => Err(io::Error::new(
            e.kind(),
            format!("io_uring_enter with {queued} queued SQEs: {e}"),
        )),
    }
}
