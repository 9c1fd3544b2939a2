//! The socket to an NBD server, and its I/O in either [`Ctx`].
//!
//! The socket stays blocking (no `O_NONBLOCK`): a thread in a blocking dispatch mode
//! sleeps in `read(2)`/`writev(2)`, and on the ring io_uring arms a poll for a socket that
//! has nothing yet, so a coroutine suspends and the loop thread never blocks. A coroutine
//! sends with `sendmsg(MSG_DONTWAIT)` first: a socket with room in its buffer (nearly
//! always) takes the command at once, without an SQE, a suspension and a resumption; only
//! what it does not take goes through the ring. TCP gets
//! `TCP_NODELAY`: a request is one `writev` and must leave at once. Either kind asks for
//! 4 MiB socket buffers, so that a 1 MiB payload usually leaves in one piece. With TLS (`tls`),
//! the same socket I/O carries the ciphertext and callers see the plaintext.
//!
//! A connection made again after a loss is bounded ([`Stream::connect`] with a limit): a
//! server that accepts and then says nothing (frozen, or a TCP peer that drops the SYN)
//! must not hold the reconnection forever. The limit is a connect timeout and
//! `SO_RCVTIMEO`/`SO_SNDTIMEO` for the handshake, lifted ([`Stream::unbounded`]) before
//! transmission: a reply may rightly take longer (a flush). On a blocking socket `EAGAIN`
//! only means that such a limit ran out, so the blocking paths report it as `TimedOut`
//! rather than retrying it.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::tls;
use super::uri::Address;
use crate::{iov, Ctx};

/// A connection to the server: a socket, with a TLS session over it once `STARTTLS` is
/// done.
pub struct Stream {
    sock: Sock,
    tls: Option<tls::Session>,
}

impl Stream {
    /// Connects to `addr` (blocking: done at open, before any loop serves, or on a helper
    /// thread); with a `limit`, the connect and every later socket I/O fail with
    /// `TimedOut` after that long without progress, until [`Stream::unbounded`].
    pub fn connect(addr: &Address, limit: Option<Duration>) -> io::Result<Stream> {
        Ok(Stream {
            sock: Sock::connect(addr, limit)?,
            tls: None,
        })
    }

    /// Lifts the limit [`Stream::connect`] set (for transmission).
    pub fn unbounded(&self) -> io::Result<()> {
        self.sock.set_limit(None)
    }

    /// Runs the TLS handshake (blocking); from then on every byte goes through TLS.
    pub fn start_tls(&mut self, client: &tls::Client) -> io::Result<()> {
        self.tls = Some(client.connect(&self.sock)?);
        Ok(())
    }

    /// Shuts both directions down: a reader blocked on it (in any thread or ring) wakes
    /// with end of file.
    pub fn shutdown(&self) {
        self.sock.shutdown();
    }

    /// What to say when the server closes the connection during the handshake.
    pub fn why_closed(&self) -> String {
        let tls = self.tls.as_ref().and_then(|t| t.why_closed());
        tls.unwrap_or_else(|| "the server closed the connection".into())
    }

    /// Some bytes, at least one: see [`Sock::read_some`].
    pub fn read_some(&self, cx: &Ctx<'_>, buf: &mut [u8]) -> io::Result<usize> {
        match &self.tls {
            Some(tls) => tls.read_some(&self.sock, cx, buf),
            None => self.sock.read_some(cx, buf),
        }
    }

    /// Reads exactly `buf.len()` bytes: in a coroutine without TLS, with `MSG_WAITALL`
    /// (see [`Sock::recv_all`]), else piece by piece.
    pub fn read_exact(&self, cx: &Ctx<'_>, mut buf: &mut [u8]) -> io::Result<()> {
        if let (Ctx::Coroutine(co), None) = (cx, &self.tls) {
            return self.sock.recv_all(co, buf);
        }
        while !buf.is_empty() {
            let n = self.read_some(cx, buf)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// `sendmsg(2)` calls this socket made outside the ring.
    pub fn sent_now(&self) -> u64 {
        self.sock.sent_now()
    }

    /// Writes all of `bufs`: see [`Sock::write_all`].
    pub fn write_all(&self, cx: &Ctx<'_>, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        match &self.tls {
            Some(tls) => tls.write_all(&self.sock, cx, bufs),
            None => self.sock.write_all(cx, bufs),
        }
    }
}

/// The socket buffer size asked for, each way (the kernel doubles what it grants).
const SOCK_BUF: libc::c_int = 4 << 20;

/// A connected stream socket, and the sends it made outside the ring.
#[derive(Debug)]
pub struct Sock {
    fd: SockFd,
    sent_now: AtomicU64,
}

#[derive(Debug)]
enum SockFd {
    /// TCP, with `TCP_NODELAY`.
    Tcp(TcpStream),
    /// A unix socket.
    Unix(UnixStream),
}

impl Sock {
    /// Connects to `addr` (blocking), a TCP connect within `limit` if given; the limit
    /// then stays on the socket's I/O until [`Sock::set_limit`] lifts it.
    pub fn connect(addr: &Address, limit: Option<Duration>) -> io::Result<Sock> {
        let fd = match addr {
            Address::Tcp { host, port } => {
                let tcp = match limit {
                    None => TcpStream::connect((host.as_str(), *port))?,
                    Some(limit) => connect_tcp_within((host.as_str(), *port), limit)?,
                };
                tcp.set_nodelay(true)?;
                SockFd::Tcp(tcp)
            }
            Address::Unix(path) => SockFd::Unix(UnixStream::connect(path)?),
        };
        let sock = Sock {
            fd,
            sent_now: AtomicU64::new(0),
        };
        sock.set_limit(limit)?;
        sock.grow_buffers();
        Ok(sock)
    }

    /// Sets (or with `None` lifts) the time a blocking read or write may wait.
    pub fn set_limit(&self, limit: Option<Duration>) -> io::Result<()> {
        match &self.fd {
            SockFd::Tcp(s) => {
                s.set_read_timeout(limit)?;
                s.set_write_timeout(limit)
            }
            SockFd::Unix(s) => {
                s.set_read_timeout(limit)?;
                s.set_write_timeout(limit)
            }
        }
    }

    /// `sendmsg(2)` calls made at once by coroutines (system calls outside the ring).
    pub fn sent_now(&self) -> u64 {
        self.sent_now.load(Ordering::Relaxed)
    }

    /// Asks for [`SOCK_BUF`] bytes of send and receive buffer (best effort: the kernel
    /// caps it at `net.core.wmem_max`/`rmem_max`), so that a 1 MiB write usually leaves
    /// in one `writev` rather than in pieces of the default ~200 KiB, each a ring
    /// completion and a coroutine switch.
    fn grow_buffers(&self) {
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            if let Err(e) = crate::sys::set_sock_buf(self.as_fd(), opt, SOCK_BUF) {
                log::debug!("nbd: socket buffer option {opt}: {e}");
            }
        }
    }

    /// Shuts both directions down: a reader blocked on it (in any thread or ring) wakes
    /// with end of file.
    pub fn shutdown(&self) {
        let _ = match &self.fd {
            SockFd::Tcp(s) => s.shutdown(Shutdown::Both),
            SockFd::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// One read: a ring `IORING_OP_READ` in a coroutine, `read(2)` otherwise. `EINTR` and
    /// `EAGAIN` are retried; end of file is `UnexpectedEof`.
    pub fn read_some(&self, cx: &Ctx<'_>, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let res = match cx {
                Ctx::Coroutine(_) => cx.read(self, buf),
                Ctx::Blocking => self.blocking_read(buf),
            };
            match res {
                Ok(0) if !buf.is_empty() => return Err(io::ErrorKind::UnexpectedEof.into()),
                Err(e) if transient(&e) => continue,
                done => return done,
            }
        }
    }

    /// Receives exactly `buf.len()` bytes on the ring with `MSG_WAITALL`: the kernel goes
    /// on receiving until `buf` is full, so a 1 MiB payload that arrives in pieces of the
    /// server's socket buffer completes once. `EINTR`/`EAGAIN` and a short completion go
    /// round again; end of file is `UnexpectedEof`.
    pub fn recv_all(&self, co: &runtime::Co<'_>, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match co.ctx().recv(self, buf, libc::MSG_WAITALL) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if transient(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `bufs`, resuming short writes: in a coroutine, what the socket takes
    /// at once (`sendmsg` with `MSG_DONTWAIT`), the rest by `IORING_OP_WRITEV`, which
    /// waits for room on the ring; `writev(2)` otherwise. `bufs` is advanced past what was
    /// written.
    pub fn write_all(&self, cx: &Ctx<'_>, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        IoSlice::advance_slices(&mut bufs, 0); // drop empty leading slices
        let mut try_now = true;
        while !bufs.is_empty() {
            let n = bufs.len().min(crate::IOV_MAX);
            let res = match cx {
                Ctx::Coroutine(_) if try_now => {
                    self.sent_now.fetch_add(1, Ordering::Relaxed);
                    let sent = crate::sys::send_now(self.as_fd(), &bufs[..n]);
                    // Full: the ring waits for room from here on.
                    try_now = matches!(sent, Ok(m) if m == iov::total(&bufs[..n]));
                    match sent {
                        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
                        sent => sent,
                    }
                }
                Ctx::Coroutine(_) => cx.writev(self, &bufs[..n]),
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
        let read = match &self.fd {
            SockFd::Tcp(s) => (&*s).read(buf),
            SockFd::Unix(s) => (&*s).read(buf),
        };
        read.map_err(limit_ran_out)
    }

    fn blocking_write(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let written = match &self.fd {
            SockFd::Tcp(s) => (&*s).write_vectored(bufs),
            SockFd::Unix(s) => (&*s).write_vectored(bufs),
        };
        written.map_err(limit_ran_out)
    }
}

/// A TCP connection to `addr` (each address it resolves to, in turn), each attempt
/// within `limit`.
fn connect_tcp_within(addr: impl ToSocketAddrs, limit: Duration) -> io::Result<TcpStream> {
    let mut last = None;
    for one in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&one, limit) {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the host resolves to no address")))
}

/// `EAGAIN` from a blocking socket: its `SO_RCVTIMEO`/`SO_SNDTIMEO` ran out.
fn limit_ran_out(e: io::Error) -> io::Error {
    match e.raw_os_error() == Some(libc::EAGAIN) {
        true => io::Error::new(io::ErrorKind::TimedOut, "the server did not answer in time"),
        false => e,
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.fd {
            SockFd::Tcp(s) => s.as_fd(),
            SockFd::Unix(s) => s.as_fd(),
        }
    }
}
