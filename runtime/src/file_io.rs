//! The blocking side of [`Ctx`](crate::Ctx): thin wrappers over the syscalls that std does
//! not offer for a borrowed fd (pread, pwrite, preadv, pwritev, fsync, fdatasync, fallocate,
//! ftruncate; read, recv, writev and poll for streams), and `IORING_OP_FTRUNCATE`, which
//! [`Co`] has no method for.
//!
//! Every wrapper takes a [`BorrowedFd`], so the fd is open for the whole call, and turns a
//! `-1` result into [`io::Error::last_os_error`]. Offsets are checked to fit `off_t`
//! ([`to_off`]), so a huge `u64` fails with `EINVAL` instead of wrapping negative. Nothing
//! here retries: EINTR/EAGAIN handling belongs to [`Ctx`](crate::Ctx).

use std::ffi::c_int;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{opcode, types, Co};

/// Most iovecs one `preadv`/`pwritev` (or `IORING_OP_READV`) accepts: Linux `UIO_MAXIOV`.
pub const IOV_MAX: usize = 1024;

/// `-1` becomes the thread's errno; anything else is the result.
pub fn cvt<T: Copy + PartialEq + From<i8>>(res: T) -> io::Result<T> {
    if res == T::from(-1) {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
    }
}

/// A byte offset as `off_t`, or `EINVAL` if it does not fit.
pub fn to_off(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `preadv(2)` into at most [`IOV_MAX`] of `bufs`.
pub(crate) fn preadv(
    fd: BorrowedFd<'_>,
    bufs: &mut [IoSliceMut<'_>],
    off: u64,
) -> io::Result<usize> {
    let (off, cnt) = (to_off(off)?, bufs.len().min(IOV_MAX) as c_int);
    // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` (std documents it); the array and
    // the buffers it names are borrowed mutably for the duration of the call.
    let n = unsafe { libc::preadv(fd.as_raw_fd(), bufs.as_mut_ptr().cast(), cnt, off) };
    cvt(n).map(|n| n as usize)
}

/// `pread(2)` into `buf`.
pub(crate) fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let off = to_off(off)?;
    // SAFETY: `buf` is borrowed mutably for the duration of the call, and its length bounds
    // the write.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), off) };
    cvt(n).map(|n| n as usize)
}

/// `pwrite(2)` from `buf`.
pub(crate) fn pwrite(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<usize> {
    let off = to_off(off)?;
    // SAFETY: `buf` is borrowed for the duration of the call and only read.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), off) };
    cvt(n).map(|n| n as usize)
}

/// `read(2)` into `buf`, at the file position.
pub(crate) fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is borrowed mutably for the duration of the call, and its length bounds
    // the write.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    cvt(n).map(|n| n as usize)
}

/// `recv(2)` into `buf` with `flags` (`MSG_*`).
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    // SAFETY: `buf` is borrowed mutably for the duration of the call, and its length bounds
    // the write.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    cvt(n).map(|n| n as usize)
}

/// `writev(2)` from at most [`IOV_MAX`] of `bufs`, at the file position.
pub(crate) fn writev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    let cnt = bufs.len().min(IOV_MAX) as c_int;
    // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the array and its buffers are
    // borrowed for the duration of the call and only read.
    let n = unsafe { libc::writev(fd.as_raw_fd(), bufs.as_ptr().cast(), cnt) };
    cvt(n).map(|n| n as usize)
}

/// `poll(2)` on `fd` alone for `events`, without a timeout; returns the events that fired.
pub(crate) fn poll(fd: BorrowedFd<'_>, events: i16) -> io::Result<i16> {
    let mut one = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one `pollfd` on this stack, valid for the call, and a count of 1.
    cvt(unsafe { libc::poll(&mut one, 1, -1) })?;
    Ok(one.revents)
}

/// `pwritev(2)` from at most [`IOV_MAX`] of `bufs`.
pub(crate) fn pwritev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], off: u64) -> io::Result<usize> {
    let (off, cnt) = (to_off(off)?, bufs.len().min(IOV_MAX) as c_int);
    // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the array and its buffers are
    // borrowed for the duration of the call and only read.
    let n = unsafe { libc::pwritev(fd.as_raw_fd(), bufs.as_ptr().cast(), cnt, off) };
    cvt(n).map(|n| n as usize)
}

/// `openat(2)` of `path` relative to `dir`, `O_CLOEXEC` added.
pub fn openat(
    dir: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    flags: c_int,
    mode: u32,
) -> io::Result<std::os::fd::OwnedFd> {
    let flags = flags | libc::O_CLOEXEC;
    // SAFETY: the path is NUL-terminated and outlives the call; the fd is open for it.
    let fd = cvt(unsafe { libc::openat(dir.as_raw_fd(), path.as_ptr(), flags, mode) })?;
    // SAFETY: a descriptor the call just opened, owned by nothing else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// `fsync(2)`.
pub(crate) fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::fsync(fd.as_raw_fd()) }).map(drop)
}

/// `fdatasync(2)`.
pub(crate) fn fdatasync(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::fdatasync(fd.as_raw_fd()) }).map(drop)
}

/// `fallocate(2)` with `mode` (`FALLOC_FL_*`).
pub(crate) fn fallocate(fd: BorrowedFd<'_>, mode: c_int, off: u64, len: u64) -> io::Result<()> {
    let (off, len) = (to_off(off)?, to_off(len)?);
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, off, len) }).map(drop)
}

/// `ftruncate(2)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = to_off(len)?;
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

/// One `IORING_OP_FTRUNCATE` (Linux 6.9) through a coroutine's ring; `EINVAL` on older
/// kernels.
pub(crate) fn ring_ftruncate(co: &Co<'_>, fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let sqe = opcode::Ftruncate::new(types::Fd(fd.as_raw_fd()), len).build();
    // SAFETY: the SQE references no memory and produces exactly one CQE.
    let res = unsafe { co.submit(sqe) }?;
    if res < 0 {
        return Err(io::Error::from_raw_os_error(-res));
    }
    Ok(())
}
