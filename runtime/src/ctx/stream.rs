//! Stream calls of [`Ctx`]: pipes, sockets and devices, at their file position. One attempt
//! each, with the kernel's answer as it is (`EAGAIN` and `EINTR` included): the module
//! contract of [`Ctx`] says why.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use super::Ctx;
use crate::file_io::{self as sys, IOV_MAX};

impl Ctx<'_> {
    /// Reads into `buf` at the file position: `IORING_OP_READ` (Linux 5.6) or `read(2)`.
    /// Returns the bytes read, 0 at end of file.
    #[inline]
    pub fn read(&self, fd: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Ctx::Coroutine(co) => co.read(fd, buf),
            Ctx::Blocking => sys::read(fd.as_fd(), buf),
        }
    }

    /// Receives into `buf` from a socket with `recv(2)`'s `flags`: `IORING_OP_RECV` (Linux
    /// 5.6) or `recv(2)`. With `MSG_WAITALL` (on the ring since Linux 5.18) one call brings
    /// the whole of `buf` unless the connection ends or fails first: in a coroutine, a large
    /// message that arrives in many pieces costs one suspension, not one per piece.
    #[inline]
    pub fn recv(&self, socket: &impl AsFd, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        match self {
            Ctx::Coroutine(co) => co.recv(socket, buf, flags),
            Ctx::Blocking => sys::recv(socket.as_fd(), buf, flags),
        }
    }

    /// Writes `bufs` at the file position (e.g. a FUSE reply, or a socket's next message):
    /// `IORING_OP_WRITEV` (Linux 5.1) or `writev(2)`. Returns the bytes written; at most
    /// [`IOV_MAX`] iovecs are used.
    #[inline]
    pub fn writev(&self, fd: &impl AsFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let bufs = &bufs[..bufs.len().min(IOV_MAX)];
        match self {
            Ctx::Coroutine(co) => co.writev(fd, bufs),
            Ctx::Blocking => sys::writev(fd.as_fd(), bufs),
        }
    }

    /// Waits until `fd` reports one of `events` (`libc::POLLIN`...) and returns the events
    /// that fired: `IORING_OP_POLL_ADD` (Linux 5.1), one shot, or `poll(2)` on that one
    /// descriptor, without a timeout.
    #[inline]
    pub fn poll(&self, fd: &impl AsFd, events: i16) -> io::Result<i16> {
        match self {
            Ctx::Coroutine(co) => co.poll(fd, events),
            Ctx::Blocking => sys::poll(fd.as_fd(), events),
        }
    }
}
