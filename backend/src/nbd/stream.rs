//! The socket to an NBD server, and its I/O in either [`Ctx`].
//!
//! The socket stays blocking (no `O_NONBLOCK`): a thread in a blocking dispatch mode
//! sleeps in `read(2)`/`writev(2)`, and on the ring io_uring arms a poll for a socket that
//! has nothing yet, so a coroutine suspends and the loop thread never blocks. TCP gets
//! `TCP_NODELAY`: a request is one `writev` and must leave at once.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use super::uri::Address;
use crate::Ctx;

/// A connected stream socket.
#[derive(Debug)]
pub enum Stream {
    /// TCP, with `TCP_NODELAY`.
    Tcp(TcpStream),
    /// A unix socket.
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr` (blocking: done at open, before any loop serves).
    pub fn connect(addr: &Address) -> io::Result<Stream> {
        match addr {
            Address::Tcp { host, port } => {
                let tcp = TcpStream::connect((host.as_str(), *port))?;
                tcp.set_nodelay(true)?;
                Ok(Stream::Tcp(tcp))
            }
            Address::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        }
    }

    /// Shuts both directions down: a reader blocked on it (in any thread or ring) wakes
    /// with end of file.
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// One read: a ring `IORING_OP_READ` in a coroutine, `read(2)` otherwise. `EINTR` and
    /// `EAGAIN` are retried; end of file is `UnexpectedEof`.
    pub fn read_some(&self, cx: &Ctx<'_>, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let res = match cx {
                Ctx::Coroutine(co) => co.read(self, buf),
                Ctx::Blocking => self.blocking_read(buf),
            };
            match res {
                Ok(0) if !buf.is_empty() => return Err(io::ErrorKind::UnexpectedEof.into()),
                Err(e) if transient(&e) => continue,
                done => return done,
            }
        }
    }

    /// Reads exactly `buf.len()` bytes.
    pub fn read_exact(&self, cx: &Ctx<'_>, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.read_some(cx, buf)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// Writes all of `bufs` (`IORING_OP_WRITEV` or `writev(2)`), resuming short writes.
    /// `bufs` is advanced past what was written.
    pub fn write_all(&self, cx: &Ctx<'_>, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut bufs, 0); // drop empty leading slices
        while !bufs.is_empty() {
            let n = bufs.len().min(crate::IOV_MAX);
            let res = match cx {
                Ctx::Coroutine(co) => co.writev(self, &bufs[..n]),
                Ctx::Blocking => self.blocking_write(&bufs[..n]),
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(done) => IoSlice::advance_slices(&mut bufs, done),
                Err(e) if transient(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn blocking_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }

    fn blocking_write(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&*s).write_vectored(bufs),
            Stream::Unix(s) => (&*s).write_vectored(bufs),
        }
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}
