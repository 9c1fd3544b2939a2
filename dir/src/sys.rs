//! The system calls the directory export makes on the source tree, each a thin safe
//! wrapper: the only unsafe code of this crate.
//!
//! Why `*at` calls on descriptors, never paths: a passthrough file system must resolve
//! each name relative to the directory the kernel named, by its handle, so that a rename
//! elsewhere in the tree, or a symlink planted in a path, cannot redirect a request.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `openat(dir, name, flags | O_CLOEXEC)`.
fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the returned descriptor is fresh and ours.
    let fd = cvt(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A handle on `name` in `dir` that opens nothing for I/O (`O_PATH`) and does not follow a
/// symlink in the last component (the link itself is the node).
pub fn open_path(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_PATH | libc::O_NOFOLLOW)
}

/// The directory behind an `O_PATH` handle, opened for reading its entries.
pub fn open_dir(handle: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    open_at(handle, c".", libc::O_RDONLY | libc::O_DIRECTORY)
}

/// `fstatat(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: the node itself, symlinks too.
pub fn stat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all-zero is a valid value, overwritten by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: the path is an empty NUL-terminated string and `st` a writable stat.
    cvt(unsafe { libc::fstatat(fd.as_raw_fd(), c"".as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// `getdents64(dir, buf)`: packed `linux_dirent64` records; 0 at the end.
pub fn getdents(dir: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for its whole length, which is what the kernel is told.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Moves a directory stream to `cookie` (0: the start; else a `d_off` it returned).
pub fn seek_dir(dir: BorrowedFd<'_>, cookie: u64) -> io::Result<()> {
    let off =
        libc::off_t::try_from(cookie).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: lseek on a descriptor we hold; no memory is passed.
    if unsafe { libc::lseek(dir.as_raw_fd(), off, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
