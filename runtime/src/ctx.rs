//! [`Ctx`]: the runtime's one public I/O API, and how a call reaches the kernel, chosen by
//! the caller per request.
//!
//! The same backend object serves three dispatch modes: a coroutine on the event loop (I/O
//! goes through the ring and the coroutine suspends), inline on the loop thread, and a pool
//! of worker threads (both plain blocking syscalls). The backend never knows which; it
//! calls these methods and the context does the rest. Code that always runs in a coroutine
//! (a transport's reader, an NBD connection's receiver) uses the same methods through
//! [`Co::ctx`](crate::Co::ctx), which is `Ctx::Coroutine`: the variant is known where it is
//! built, and every method is inlined into its caller (generic, or `#[inline]`), so the
//! `match` folds away and the call compiles to the ring operation alone. [`Co`]'s own ring methods (`ops.rs`) are crate-internal: there
//! is one way in, whatever the mode.
//!
//! # Contract
//! - File transfers (`read_at`, `readv_at`, `write_at`, `writev_at`) are one attempt each,
//!   like the syscalls: they may be short, and the caller retries. At most
//!   [`IOV_MAX`](crate::IOV_MAX) iovecs are used per call (the rest make it short), in both
//!   modes.
//! - For those and the other file calls (`fsync`, `fdatasync`, `fallocate`, `ftruncate`,
//!   `open_at`), `EINTR` and `EAGAIN` are retried here and never reach the caller.
//! - Offsets above `i64::MAX` fail with `EINVAL` before anything is submitted (on the ring,
//!   `u64::MAX` would mean "the file position").
//! - Stream calls (`read`, `recv`, `writev`, `poll`: pipes, sockets, devices) return what
//!   the kernel returned, `EAGAIN` and `EINTR` included: on a non-blocking descriptor
//!   `EAGAIN` is an answer (the caller polls, or stops), not something to spin on. (On the
//!   ring a socket waits for data whatever its `O_NONBLOCK`: give `recv` `MSG_DONTWAIT`
//!   for an answer now.) `writev` uses at most [`IOV_MAX`](crate::IOV_MAX) iovecs as well.
//! - What only a ring can do (`nop`, and the raw [`Ctx::submit`] and [`Ctx::submit128`])
//!   fails in `Blocking` mode, with nothing done, with an error of kind
//!   [`io::ErrorKind::Unsupported`] that carries a [`NoRing`].
//! - In a coroutine, every call fails with `ECANCELED`, at once and without submitting,
//!   while the runtime shuts down.
//! - Never mix modes on one thread: a `Blocking` call made on the loop thread while a
//!   coroutine of that loop holds a backend lock would wait forever.

mod ring;
mod stream;

pub use ring::NoRing;

use std::ffi::CStr;
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};

use crate::file_io::{self as sys, IOV_MAX};
use crate::Co;

/// The execution context of one backend call, and the runtime's I/O API: every I/O call
/// outside the runtime is a method of `Ctx` (in a coroutine, [`Co::ctx`]).
#[derive(Clone, Copy)]
pub enum Ctx<'a> {
    /// Inside a coroutine: I/O is submitted to the loop's io_uring and the coroutine
    /// suspends until the completion.
    Coroutine(&'a Co<'a>),
    /// On an ordinary thread (inline on the loop, or a worker): blocking syscalls.
    Blocking,
}

impl fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ctx::Coroutine(co) => write!(f, "Ctx::Coroutine({:?})", co.id()),
            Ctx::Blocking => f.write_str("Ctx::Blocking"),
        }
    }
}

/// Errors that mean "try again", not "failed".
fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

/// Runs `op` until it returns something other than EINTR/EAGAIN.
fn retry<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if is_transient(&e) => continue,
            done => return done,
        }
    }
}

impl Ctx<'_> {
    /// Reads into `buf` at `offset`: `IORING_OP_READ` (Linux 5.6) or `pread(2)`. Returns
    /// the bytes read, 0 at end of file.
    #[inline]
    pub fn read_at(&self, fd: &impl AsFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        sys::to_off(offset)?;
        retry(|| match self {
            Ctx::Coroutine(co) => co.read_at(fd, buf, offset),
            Ctx::Blocking => sys::pread(fd.as_fd(), buf, offset),
        })
    }

    /// Writes `buf` at `offset`: `IORING_OP_WRITE` (Linux 5.6) or `pwrite(2)`. Returns the
    /// bytes written.
    #[inline]
    pub fn write_at(&self, fd: &impl AsFd, buf: &[u8], offset: u64) -> io::Result<usize> {
        sys::to_off(offset)?;
        retry(|| match self {
            Ctx::Coroutine(co) => co.write_at(fd, buf, offset),
            Ctx::Blocking => sys::pwrite(fd.as_fd(), buf, offset),
        })
    }

    /// Reads into `bufs` at `offset`: `IORING_OP_READV` (Linux 5.1) or `preadv(2)`.
    /// Returns the bytes read, 0 at end of file.
    pub fn readv_at(
        &self,
        fd: &impl AsFd,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
    ) -> io::Result<usize> {
        sys::to_off(offset)?;
        let len = bufs.len().min(IOV_MAX);
        let bufs = &mut bufs[..len];
        retry(|| match self {
            Ctx::Coroutine(co) => co.readv_at(fd, bufs, offset),
            Ctx::Blocking => sys::preadv(fd.as_fd(), bufs, offset),
        })
    }

    /// Writes `bufs` at `offset`: `IORING_OP_WRITEV` (Linux 5.1) or `pwritev(2)`.
    /// Returns the bytes written.
    pub fn writev_at(
        &self,
        fd: &impl AsFd,
        bufs: &[IoSlice<'_>],
        offset: u64,
    ) -> io::Result<usize> {
        sys::to_off(offset)?;
        let bufs = &bufs[..bufs.len().min(IOV_MAX)];
        retry(|| match self {
            Ctx::Coroutine(co) => co.writev_at(fd, bufs, offset),
            Ctx::Blocking => sys::pwritev(fd.as_fd(), bufs, offset),
        })
    }

    /// Flushes data and metadata: `IORING_OP_FSYNC` (Linux 5.1) or `fsync(2)`.
    pub fn fsync(&self, fd: &impl AsFd) -> io::Result<()> {
        retry(|| match self {
            Ctx::Coroutine(co) => co.fsync(fd),
            Ctx::Blocking => sys::fsync(fd.as_fd()),
        })
    }

    /// Flushes data (and the metadata needed to read it back, such as the size):
    /// `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC` or `fdatasync(2)`.
    pub fn fdatasync(&self, fd: &impl AsFd) -> io::Result<()> {
        retry(|| match self {
            Ctx::Coroutine(co) => co.fdatasync(fd),
            Ctx::Blocking => sys::fdatasync(fd.as_fd()),
        })
    }

    /// `fallocate(2)` with `mode` (`libc::FALLOC_FL_*`): `IORING_OP_FALLOCATE` (Linux 5.6)
    /// or the syscall.
    pub fn fallocate(&self, fd: &impl AsFd, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        sys::to_off(offset)?;
        retry(|| match self {
            Ctx::Coroutine(co) => co.fallocate(fd, mode, offset, len),
            Ctx::Blocking => sys::fallocate(fd.as_fd(), mode, offset, len),
        })
    }

    /// Sets the file size: `IORING_OP_FTRUNCATE` (Linux 6.9), falling back to
    /// `ftruncate(2)` on the calling thread where the ring refuses the opcode.
    pub fn ftruncate(&self, fd: &impl AsFd, len: u64) -> io::Result<()> {
        sys::to_off(len)?;
        if let Ctx::Coroutine(co) = self {
            match retry(|| sys::ring_ftruncate(co, fd.as_fd(), len)) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {}
                done => return done,
            }
        }
        retry(|| sys::ftruncate(fd.as_fd(), len))
    }

    /// Opens `path` relative to the directory `dir` with open(2)'s `flags` and `mode`
    /// (`O_CLOEXEC` added): `IORING_OP_OPENAT2` (Linux 5.6), which blocks no loop on a slow
    /// path walk, or `openat(2)`.
    pub fn open_at(
        &self,
        dir: &impl AsFd,
        path: &CStr,
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        retry(|| match self {
            Ctx::Coroutine(co) => co.openat(dir, path, flags, mode),
            Ctx::Blocking => sys::openat(dir.as_fd(), path, flags, mode),
        })
    }
}
