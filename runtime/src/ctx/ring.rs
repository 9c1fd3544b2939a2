//! Waits and the ring's own operations in [`Ctx`]: `sleep` (both modes), `nop` and the raw
//! submissions (a ring only). Without a ring these fail with [`NoRing`], never a panic.

use std::error::Error;
use std::fmt;
use std::io;
use std::time::Duration;

use io_uring::squeue;

use super::Ctx;

/// What a ring-only call of [`Ctx`] (`nop`, `submit`, `submit128`) returns in
/// [`Ctx::Blocking`] mode, inside an [`io::Error`] of kind [`io::ErrorKind::Unsupported`]:
/// nothing was done. Find it with `err.get_ref()?.downcast_ref::<NoRing>()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRing {
    op: &'static str,
}

impl NoRing {
    /// The call that was refused (`"nop"`, `"submit"`, `"submit128"`).
    pub fn op(&self) -> &'static str {
        self.op
    }

    #[cold]
    fn error(op: &'static str) -> io::Error {
        io::Error::new(io::ErrorKind::Unsupported, NoRing { op })
    }
}

impl fmt::Display for NoRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Ctx::{} needs an io_uring and Ctx::Blocking has none: call it from a coroutine \
             (co.ctx())",
            self.op
        )
    }
}

impl Error for NoRing {}

impl Ctx<'_> {
    /// Waits for `duration`: `IORING_OP_TIMEOUT` (Linux 5.4) in a coroutine, which lets the
    /// loop serve others meanwhile, or `thread::sleep`. Fails with `ECANCELED`, at once,
    /// while the runtime shuts down.
    #[inline]
    pub fn sleep(&self, duration: Duration) -> io::Result<()> {
        match self {
            Ctx::Coroutine(co) => co.sleep(duration),
            Ctx::Blocking => {
                std::thread::sleep(duration);
                Ok(())
            }
        }
    }

    /// `IORING_OP_NOP` (Linux 5.1): a full round trip through the ring that does nothing
    /// (what a suspension on I/O costs). A ring only: [`NoRing`] in `Blocking` mode.
    #[inline(always)]
    pub fn nop(&self) -> io::Result<()> {
        match self {
            Ctx::Coroutine(co) => co.nop(),
            Ctx::Blocking => Err(NoRing::error("nop")),
        }
    }

    /// Escape hatch for an operation the other methods lack: submits a prepared SQE and
    /// suspends until its completion; returns the CQE's `res` (a negative errno on
    /// failure, as the kernel wrote it: nothing is retried). The SQE's `user_data` is
    /// overwritten. Fails with `ECANCELED`, without submitting, once the runtime is shutting
    /// down. A ring only: in `Blocking` mode nothing is submitted and the call fails
    /// with [`NoRing`] (kind [`io::ErrorKind::Unsupported`]), so a caller that may run
    /// either way keeps a syscall for that case.
    ///
    /// # Safety
    /// - Everything the SQE points to must stay valid until this call returns. Memory owned
    ///   by this coroutine (its stack, or borrowed for the call) satisfies this: the loop
    ///   never frees a coroutine's stack while its SQE is in flight, even at shutdown, when
    ///   it cancels the SQE and waits for its CQE before unwinding.
    /// - The SQE must produce exactly one CQE: no multishot operations, no
    ///   `IOSQE_CQE_SKIP_SUCCESS`, no linked chains (`IO_LINK`, `IO_HARDLINK`).
    #[inline]
    pub unsafe fn submit(&self, entry: squeue::Entry) -> io::Result<i32> {
        match self {
            // SAFETY: the caller keeps the contract above, which is `Co::submit`'s.
            Ctx::Coroutine(co) => unsafe { co.submit(entry) },
            Ctx::Blocking => Err(NoRing::error("submit")),
        }
    }

    /// As [`Ctx::submit`], for a 128-byte SQE (`IORING_OP_URING_CMD`); the runtime must
    /// have been built with [`Config::sqe128`](crate::Config::sqe128).
    ///
    /// # Safety
    /// As [`Ctx::submit`].
    #[inline]
    pub unsafe fn submit128(&self, entry: squeue::Entry128) -> io::Result<i32> {
        match self {
            // SAFETY: the caller keeps the contract of `Ctx::submit`, which is `Co::submit128`'s.
            Ctx::Coroutine(co) => unsafe { co.submit128(entry) },
            Ctx::Blocking => Err(NoRing::error("submit128")),
        }
    }
}
