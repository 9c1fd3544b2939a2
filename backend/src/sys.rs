//! The crate's own unsafe code: thin wrappers over the syscalls that std does not offer
//! for a borrowed fd and the runtime's [`Ctx`](runtime::Ctx) does not cover (lseek with
//! `SEEK_DATA`, statx, the OFD lock fcntls, fstatfs, socket buffer sizes, a send that
//! never blocks, pending signals).
//!
//! Every wrapper takes a [`BorrowedFd`], so the fd is open for the whole call, and turns a
//! `-1` result into [`io::Error::last_os_error`]. Offsets are checked to fit `off_t`
//! ([`to_off`]), so a huge `u64` fails with `EINVAL` instead of wrapping negative. Nothing
//! here retries.

use std::ffi::c_int;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use runtime::file_io::{cvt, to_off};
pub use runtime::IOV_MAX;

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

/// Releases the OFD locks of `fd`'s open file description on `len` bytes from `start`.
pub(crate) fn ofd_unlock(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<()> {
    let mut lock = libc::flock {
        l_type: libc::F_UNLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: to_off(start)?,
        l_len: to_off(len)?,
        l_pid: 0, // OFD commands require 0
    };
    // SAFETY: the fd is open for the call and `lock` is a valid `struct flock`; SETLK
    // with F_UNLCK never blocks.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) })?;
    Ok(())
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

/// `pwritev2(2)` of one buffer with `RWF_DSYNC`: the write and what is needed to read it
/// back (the size) are durable on return, as after an `fdatasync` of that range alone.
pub(crate) fn pwrite_dsync(fd: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<usize> {
    let off = to_off(off)?;
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the iovec names `buf`, borrowed for the call; the fd is open for the call.
    cvt(unsafe { libc::pwritev2(fd.as_raw_fd(), &iov, 1, off, libc::RWF_DSYNC) })
        .map(|n| n as usize)
}

/// As [`pwrite_dsync`], through the coroutine's ring: `IORING_OP_WRITEV` with
/// `rw_flags` `RWF_DSYNC` (Linux 5.1).
pub(crate) fn ring_write_dsync(
    co: &runtime::Co<'_>,
    fd: BorrowedFd<'_>,
    buf: &[u8],
    off: u64,
) -> io::Result<usize> {
    to_off(off)?;
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let sqe = runtime::opcode::Writev::new(runtime::types::Fd(fd.as_raw_fd()), &iov, 1)
        .offset(off)
        .rw_flags(libc::RWF_DSYNC)
        .build();
    // SAFETY: `iov` and `buf` live on this coroutine's stack or are borrowed until the
    // CQE; one SQE, one CQE, no link.
    let res = unsafe { co.ctx().submit(sqe) }?;
    match res {
        r if r < 0 => Err(io::Error::from_raw_os_error(-r)),
        r => Ok(r as usize),
    }
}

/// `setsockopt(fd, SOL_SOCKET, opt, bytes)` for a buffer size (`SO_SNDBUF`, `SO_RCVBUF`):
/// the kernel caps `bytes` at `net.core.wmem_max` / `rmem_max` and doubles it.
pub(crate) fn set_sock_buf(fd: BorrowedFd<'_>, opt: c_int, bytes: c_int) -> io::Result<()> {
    let len = std::mem::size_of::<c_int>() as libc::socklen_t;
    let val: *const c_int = &bytes;
    // SAFETY: the fd is open for the call and `val` points to a `c_int` of `len` bytes,
    // which the kernel only reads.
    cvt(unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, val.cast(), len) })?;
    Ok(())
}

/// `sendmsg(2)` of `bufs` with `MSG_DONTWAIT | MSG_NOSIGNAL`: what the socket's buffer
/// takes at once (the rest is the caller's), `EAGAIN` if it takes nothing. The socket
/// itself stays blocking for the threads that share it; a closed peer is `EPIPE`, not a
/// signal.
pub(crate) fn send_now(fd: BorrowedFd<'_>, bufs: &[std::io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data, no iovec).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` (std documents it); the kernel only reads them.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast();
    msg.msg_iovlen = bufs.len() as _;
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    // SAFETY: the fd is open for the call; `msg` and the iovecs and buffers it points to are
    // borrowed for the call and only read.
    cvt(unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags) }).map(|n| n as usize)
}

/// Whether SIGINT or SIGTERM is pending for this thread or the process: the daemon blocks
/// them before it opens the image (they are read from a signalfd once serving starts), so
/// a wait at open (`--open-timer`) looks for them itself, or a stop asked for meanwhile
/// would wait for the timer.
pub(crate) fn stop_pending() -> bool {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the set it is given; it is read only if that succeeded.
    if unsafe { libc::sigpending(set.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: initialised by the successful sigpending above.
    let set = unsafe { set.assume_init() };
    // SAFETY: `set` is a valid, initialised sigset_t.
    [libc::SIGINT, libc::SIGTERM]
        .iter()
        .any(|&sig| unsafe { libc::sigismember(&set, sig) } == 1)
}

/// `openat2(2)` (Linux 5.6) of `path` under `dir` (`None`: the working directory, for an
/// absolute path) with `flags` and the `RESOLVE_*` bits `resolve`: a path resolved without
/// symlinks or beneath a directory, as std's `open` cannot.
pub(crate) fn openat2(
    dir: Option<BorrowedFd<'_>>,
    path: &std::path::Path,
    flags: c_int,
    resolve: u64,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is its "nothing asked" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: `path` is a NUL-terminated string and `how` a valid open_how, both alive for
    // the call; the size passed is open_how's; `dirfd` is open or AT_FDCWD.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as c_int) })
}

/// Adds `O_DIRECT` to an open file's status flags (`fcntl(F_SETFL)`; Linux allows it).
pub(crate) fn set_direct(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain fcntl on an fd open for the call; no memory is passed.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_DIRECT) })?;
    Ok(())
}
