//! Submission: coroutines queue SQEs here (`push_sqe`), and when the submission queue is
//! full the loop makes room (`make_room`: submit what is queued, reap what completed) before
//! queuing again; cancels of a coroutine's SQE go the same way.
//!
//! It is apart from the loop because it runs inside coroutines, during a turn (through `Co`):
//! the one place a coroutine enters the ring itself, and only when the submission queue is
//! full.

use std::io;

use io_uring::{opcode, squeue};

use crate::executor::Inner;
use crate::reactor::INTERNAL;
use crate::task::{State, TaskId};

impl Inner {
    /// Queues an SQE for the coroutine at `key`; flushes (and reaps) when the queue is full.
    ///
    /// # Safety
    /// The memory the SQE points to stays valid until its CQE is reaped.
    #[inline(always)]
    pub(crate) unsafe fn push_sqe(&self, entry: &squeue::Entry) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        if unsafe { self.reactor.try_push(entry) } {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.push_sqe_full(entry) }
    }

    /// [`Inner::push_sqe`] when the submission queue is full.
    ///
    /// # Safety
    /// As [`Inner::push_sqe`].
    #[cold]
    #[inline(never)]
    unsafe fn push_sqe_full(&self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            self.make_room()?;
            // SAFETY: forwarded from the caller.
            if unsafe { self.reactor.try_push(entry) } {
                return Ok(());
            }
        }
    }

    /// As [`Inner::push_sqe`] for a 128-byte SQE.
    ///
    /// # Safety
    /// As [`Inner::push_sqe`].
    pub(crate) unsafe fn push_sqe128(&self, entry: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: forwarded from the caller.
        while !unsafe { self.reactor.try_push128(entry)? } {
            self.make_room()?;
        }
        Ok(())
    }

    fn make_room(&self) -> io::Result<()> {
        self.reactor.enter(0, &self.counters)?;
        self.reap();
        Ok(())
    }

    /// Asks the kernel to cancel the SQE the coroutine `id` waits on (`IORING_OP_ASYNC_CANCEL`,
    /// Linux 5.5); that coroutine then resumes with `ECANCELED` (or with the operation's own
    /// result, if it completed first). Returns whether `id` was waiting on I/O.
    pub(crate) fn cancel_io(&self, id: TaskId) -> io::Result<bool> {
        let key = self.sched.with(|s| {
            s.live(|state| state == State::Io)
                .find(|&key| s.identity(key).0 == id)
        });
        let Some(key) = key else {
            return Ok(false);
        };
        self.push_cancel(key)?;
        Ok(true)
    }

    /// Queues an `IORING_OP_ASYNC_CANCEL` for the SQE of the coroutine at `key`.
    pub(crate) fn push_cancel(&self, key: usize) -> io::Result<()> {
        let cancel = opcode::AsyncCancel::new(key as u64)
            .build()
            .user_data(INTERNAL);
        // SAFETY: a cancel request points to no memory.
        unsafe { self.push_sqe(&cancel) }
    }
}
