//! /dev/fuse: open it, clone a session onto extra queues, read requests and
//! write replies with plain blocking syscalls.
//!
//! # Contract
//!
//! - One read returns exactly one whole request, and the buffer offered must
//!   hold at least [`crate::init::min_read_buffer`] bytes in total (head +
//!   tail), or the read fails with EINVAL and dequeues nothing.
//! - ENODEV (or ECONNABORTED after an abort) means the mount is gone: this
//!   queue is dead, stop reading and never spin on it ([`Received::Unmounted`]).
//!   EINTR, EAGAIN (O_NONBLOCK) and ENOENT (request aborted while being read)
//!   mean "read again" ([`Received::Retry`]).
//! - A reply goes to the fd its request was read from.
//!
//! Transports that drive the fd themselves (io_uring) use [`FuseDev::as_fd`]
//! and [`classify_read`] on their completions.

use crate::abi::FUSE_DEV_IOC_CLONE;
use crate::sys::{cvt, explain};
use std::fs::OpenOptions;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Path of the FUSE device.
pub const DEV_FUSE: &str = "/dev/fuse";

/// An open /dev/fuse fd: a session (after mount) or a queue cloned from one.
#[derive(Debug)]
pub struct FuseDev {
    fd: OwnedFd,
}

/// Outcome of one read of /dev/fuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Received {
    /// A request of this many bytes is in the buffer(s).
    Request(usize),
    /// Nothing this time (EINTR, EAGAIN, ENOENT): read again.
    Retry,
    /// ENODEV / ECONNABORTED: the file system is unmounted; stop this queue.
    Unmounted,
}

impl FuseDev {
    /// Opens /dev/fuse for blocking reads (O_RDWR | O_CLOEXEC).
    pub fn open() -> io::Result<FuseDev> {
        FuseDev::open_with(false)
    }

    /// Opens /dev/fuse with O_NONBLOCK, as io_uring reads need.
    pub fn open_nonblocking() -> io::Result<FuseDev> {
        FuseDev::open_with(true)
    }

    fn open_with(nonblocking: bool) -> io::Result<FuseDev> {
        let flags = if nonblocking { libc::O_NONBLOCK } else { 0 };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(DEV_FUSE);
        file.map(|f| FuseDev { fd: f.into() }).map_err(open_error)
    }

    /// A new queue of this session: a fresh /dev/fuse fd attached with
    /// `FUSE_DEV_IOC_CLONE`. Clones share the session's input queue. Only
    /// valid once this fd is mounted.
    pub fn clone_queue(&self, nonblocking: bool) -> io::Result<FuseDev> {
        let queue = FuseDev::open_with(nonblocking)?;
        let session = self.fd.as_raw_fd() as u32;
        // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 through the pointer, which
        // points to a live local; both fds are open for the whole call.
        let res = unsafe {
            libc::ioctl(
                queue.as_raw_fd(),
                FUSE_DEV_IOC_CLONE as libc::Ioctl,
                &session,
            )
        };
        cvt(res).map_err(|e| {
            explain(
                e,
                "FUSE_DEV_IOC_CLONE failed; clone a session fd only after mount",
            )
        })?;
        Ok(queue)
    }

    /// Blocking read of one request into `buf`.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Received> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes during the call.
        let res = unsafe { libc::read(self.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        classify_read(cvt(res).map(|n| n as usize))
    }

    /// Blocking read of one request into `head`, continuing into `tail`;
    /// pass the result to [`split_read`] and then to the decoder.
    pub fn read_split(&self, head: &mut [u8], tail: &mut [u8]) -> io::Result<Received> {
        let mut iov = [IoSliceMut::new(head), IoSliceMut::new(tail)];
        // SAFETY: IoSliceMut is ABI-compatible with `struct iovec` on Unix;
        // both buffers are valid for writes during the call.
        let res = unsafe { libc::readv(self.as_raw_fd(), iov.as_mut_ptr().cast(), 2) };
        classify_read(cvt(res).map(|n| n as usize))
    }

    /// One writev(2) of a reply's iovecs; see [`crate::reply::send`].
    pub fn writev(&self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let count = libc::c_int::try_from(iov.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: IoSlice is ABI-compatible with `struct iovec` on Unix; the
        // slices are valid for reads during the call.
        let res = unsafe { libc::writev(self.as_raw_fd(), iov.as_ptr().cast(), count) };
        cvt(res).map(|n| n as usize)
    }
}

/// Classifies the result of a read of /dev/fuse, however it was issued.
pub fn classify_read(res: io::Result<usize>) -> io::Result<Received> {
    let err = match res {
        Ok(n) => return Ok(Received::Request(n)),
        Err(err) => err,
    };
    match err.raw_os_error() {
        Some(libc::ENODEV | libc::ECONNABORTED) => Ok(Received::Unmounted),
        Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => Ok(Received::Retry),
        Some(libc::EINVAL) => Err(explain(
            err,
            "read buffer of /dev/fuse too small; offer init::min_read_buffer(max_write) bytes",
        )),
        _ => Err(err),
    }
}

/// Whether the FUSE connection behind `fd` (a session or a clone) is gone: unmounted,
/// from outside or by us, or aborted. The kernel then reports `POLLERR` to every poll of
/// the device, whatever was asked for. A poll that fails says nothing: not gone.
pub fn connection_gone(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd, a live local, for the call; a zero timeout never blocks.
    let res = unsafe { libc::poll(&mut pfd, 1, 0) };
    res == 1 && pfd.revents & libc::POLLERR != 0
}

/// The bytes a read of `n` placed in `head` and then in `tail`.
pub fn split_read<'a>(head: &'a [u8], tail: &'a [u8], n: usize) -> (&'a [u8], &'a [u8]) {
    let in_head = n.min(head.len());
    let in_tail = (n - in_head).min(tail.len());
    (&head[..in_head], &tail[..in_tail])
}

/// The system page size (the unit of `max_pages`).
pub fn page_size() -> usize {
    // SAFETY: sysconf(3) has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

fn open_error(err: io::Error) -> io::Error {
    let hint = match err.raw_os_error() {
        Some(libc::ENOENT) => "/dev/fuse does not exist: load the module with `modprobe fuse` (in a container, pass the device in, e.g. --device /dev/fuse)",
        Some(libc::ENODEV | libc::ENXIO) => "/dev/fuse has no driver: load the module with `modprobe fuse`",
        Some(libc::EACCES | libc::EPERM) => "permission denied on /dev/fuse: run as root, or make it accessible (mode 0666, as most distributions ship it)",
        _ => "cannot open /dev/fuse",
    };
    explain(err, hint)
}

impl AsFd for FuseDev {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for FuseDev {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<OwnedFd> for FuseDev {
    /// Wraps an fd that is /dev/fuse (e.g. received from fusermount3).
    fn from(fd: OwnedFd) -> FuseDev {
        FuseDev { fd }
    }
}

impl From<FuseDev> for OwnedFd {
    fn from(dev: FuseDev) -> OwnedFd {
        dev.fd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_read_follows_readv() {
        let (head, tail) = ([1u8; 8], [2u8; 8]);
        assert_eq!(split_read(&head, &tail, 5), (&head[..5], &tail[..0]));
        assert_eq!(split_read(&head, &tail, 12), (&head[..], &tail[..4]));
        assert_eq!(split_read(&head, &tail, 99), (&head[..], &tail[..]));
    }

    #[test]
    fn read_errors_are_classified() {
        let classify = |code| classify_read(Err(io::Error::from_raw_os_error(code)));
        assert_eq!(classify(libc::ENODEV).unwrap(), Received::Unmounted);
        assert_eq!(classify(libc::ECONNABORTED).unwrap(), Received::Unmounted);
        assert_eq!(classify(libc::EINTR).unwrap(), Received::Retry);
        assert_eq!(classify(libc::EAGAIN).unwrap(), Received::Retry);
        assert_eq!(classify(libc::ENOENT).unwrap(), Received::Retry);
        assert!(classify(libc::EINVAL)
            .unwrap_err()
            .to_string()
            .contains("min_read_buffer"));
        assert_eq!(
            classify(libc::EIO).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
    }

    #[test]
    fn page_size_is_sane() {
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
    }
}
