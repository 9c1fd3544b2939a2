//! The crate's only unsafe code: thin wrappers over the syscalls that std does not offer
//! for a borrowed fd (preadv, pwritev, fallocate, lseek with `SEEK_DATA`, statx, the OFD
//! lock fcntls), and the one ring operation the runtime has no method for
//! (`IORING_OP_FTRUNCATE`).
//!
//! Every wrapper takes a [`BorrowedFd`], so the fd is open for the whole call, and turns a
//! `-1` result into [`io::Error::last_os_error`]. Offsets are checked to fit `off_t`
//! ([`to_off`]), so a huge `u64` fails with `EINVAL` instead of wrapping negative. Nothing
//! here retries: EINTR/EAGAIN handling belongs to [`Ctx`](crate::Ctx).

use std::ffi::c_int;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use runtime::{opcode, types, Co};

/// Most iovecs one `preadv`/`pwritev` (or `IORING_OP_READV`) accepts: Linux `UIO_MAXIOV`.
pub const IOV_MAX: usize = 1024;

/// `-1` becomes the thread's errno; anything else is the result.
fn cvt<T: Copy + PartialEq + From<i8>>(res: T) -> io::Result<T> {
    if res == T::from(-1) {
        Err(io::Error::last_os_error())
    } else {
        Ok(res)
    }
}

/// A byte offset as `off_t`, or `EINVAL` if it does not fit.
pub(crate) fn to_off(offset: u64) -> io::Result<libc::off_t> {
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

/// `pwritev(2)` from at most [`IOV_MAX`] of `bufs`.
pub(crate) fn pwritev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], off: u64) -> io::Result<usize> {
    let (off, cnt) = (to_off(off)?, bufs.len().min(IOV_MAX) as c_int);
    // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the array and its buffers are
    // borrowed for the duration of the call and only read.
    let n = unsafe { libc::pwritev(fd.as_raw_fd(), bufs.as_ptr().cast(), cnt, off) };
    cvt(n).map(|n| n as usize)
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

/// `lseek(2)`; used with `SEEK_DATA`/`SEEK_HOLE`, which std's `Seek` does not offer.
pub(crate) fn lseek(fd: BorrowedFd<'_>, off: u64, whence: c_int) -> io::Result<u64> {
    let off = to_off(off)?;
    // SAFETY: plain syscall on an fd that is open for the call; no memory is passed.
    cvt(unsafe { libc::lseek(fd.as_raw_fd(), off, whence) }).map(|pos| pos as u64)
}

/// One open file description lock command on the single byte `byte`: `fcntl(fd, cmd, ..)`
/// with `cmd` `F_OFD_SETLK` or `F_OFD_GETLK` (Linux 3.15) and `kind` `F_RDLCK`, `F_WRLCK`
/// or `F_UNLCK`. Returns the `l_type` the kernel leaves: after `F_OFD_GETLK`, `F_UNLCK`
/// if no other open file description holds a conflicting lock.
pub(crate) fn ofd_lock(
    fd: BorrowedFd<'_>,
    cmd: c_int,
    byte: u64,
    kind: c_int,
) -> io::Result<c_int> {
    let mut lock = libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: to_off(byte)?,
        l_len: 1,
        l_pid: 0, // OFD commands require 0
    };
    // SAFETY: the fd is open for the call and `lock` is a valid, writable `struct flock`
    // that GETLK may fill in; SETLK never blocks.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut lock) })?;
    Ok(c_int::from(lock.l_type))
}

/// `statx(2)` with `STATX_DIOALIGN` (Linux 6.1): `(memory, offset)` alignment that O_DIRECT
/// needs, or `None` if the kernel or filesystem does not report it.
pub(crate) fn dio_align(fd: BorrowedFd<'_>) -> io::Result<Option<(u32, u32)>> {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    let (flags, mask) = (libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN);
    // SAFETY: the path is a valid empty C string (AT_EMPTY_PATH makes statx use the fd) and
    // `stx` is writable memory of the type the kernel fills in.
    let res = unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), flags, mask, stx.as_mut_ptr()) };
    cvt(res)?;
    // SAFETY: all-zero bytes are a valid `statx` (plain integers), and statx wrote over them.
    let stx = unsafe { stx.assume_init() };
    let (mem, off) = (stx.stx_dio_mem_align, stx.stx_dio_offset_align);
    Ok((stx.stx_mask & mask != 0 && mem != 0 && off != 0).then_some((mem, off)))
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

/// Whether `file` lives on tmpfs (`fstatfs(2)`): its buffered writes are memory copies that
/// never wait for a device, and io_uring would hand each one to a worker thread (tmpfs has
/// no asynchronous buffered writes).
pub(crate) fn is_tmpfs(file: &impl AsFd) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: statfs is plain data, filled by the kernel below.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is valid for the borrow and `st` is a writable statfs.
    let rc = unsafe { libc::fstatfs(file.as_fd().as_raw_fd(), &mut st) };
    rc == 0 && st.f_type as i64 == TMPFS_MAGIC
}
