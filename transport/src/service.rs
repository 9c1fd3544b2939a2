//! The seam between the transports and what they serve: a FUSE file system.
//!
//! Every transport (`coroutine` and `inline` in [`crate::coroutine`], `threads:N` in
//! [`crate::blocking`]) reads a request, decodes it, and asks a [`FileSystem`] to serve it
//! with the [`Ctx`] it runs in. The file system returns the reply instead of sending it, so
//! that each transport sends it its own way (`writev(2)`, an SQE, or, for FUSE over
//! io_uring, a commit in the request's own ring entry). The image export
//! (`image_export::Export`) is one, the directory export (`dir_export::DirFs`) another.
//!
//! # Contract
//! - `handle` does all I/O that may wait on a device or another machine through `cx`,
//!   so that it suspends the request's coroutine, not its loop. A system call that cannot
//!   be put on the ring, or that costs more there than it ever waits, may run directly,
//!   and the file system says which in its own docs: the image export runs everything
//!   through `cx`; the directory export runs its data through `cx` and, on a network or
//!   FUSE source, its metadata calls off the loop (LOOKUP through `cx`, the others on
//!   helper threads), on a local one directly (`dir_export::fs`, "What blocks").
//! - The reply borrows only from `scratch` and `data`, both owned by the transport for the
//!   request's lifetime; nothing is allocated per request.
//! - `data` is page-aligned and at least `max_write` bytes when the opcode's reply needs
//!   it ([`fuse::OpKind::needs_data_buffer`], the same rule for every file system), and
//!   empty otherwise.
//! - A file system says what it does per operation in [`Operations`] (one method each,
//!   ENOSYS by default); `handle` runs them through the one adapter, [`crate::ops::handle`].
//!   A file system overrides `handle` only to stand between the transport and another
//!   file system (a test's wrapper).
//! - A request is served with blocking calls on its loop's thread only where the file
//!   system says no wait of it can stall ([`FileSystem::waits_are_bounded`]).
//! - `session_started` runs once, after INIT and before the first request.
//! - `close` runs once, after the last request and before the unmount, so that the mount
//!   goes only once the file system is durable and free for the next user; by default it
//!   is `flush`.

use std::io;
use std::os::fd::BorrowedFd;

use runtime::Ctx;

use fuse::init::{InitConfig, Negotiated};
use fuse::{Reply, Request};

use crate::ops::Operations;

/// A file system that every transport can serve: its session (INIT, start, flush, close)
/// here, its answer to each operation in [`Operations`]. `Send + Sync`: worker threads
/// and several queues share one.
pub trait FileSystem: Operations {
    /// What to ask for at INIT, starting from the transport's `config` (flags, limits).
    fn init_config(&self, config: InitConfig) -> InitConfig {
        config
    }

    /// Called once the INIT handshake is done, before the first request is served, with
    /// what was negotiated and a /dev/fuse fd of the session: for the file system's own
    /// requests on the connection, such as FUSE passthrough's backing files (keep a
    /// duplicate; every transport's fds belong to the same connection).
    fn session_started(&self, negotiated: &Negotiated, session: BorrowedFd<'_>) {
        let _ = (negotiated, session);
    }

    /// Serves one decoded request. Returns `None` for requests that take no reply (FORGET,
    /// INTERRUPT...). By default through [`Operations`] ([`crate::ops::handle`]).
    fn handle<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        scratch: &'b mut Self::Scratch,
        data: &'b mut [u8],
    ) -> Option<Reply<'b>> {
        crate::ops::handle(self, cx, req, scratch, data)
    }

    /// Makes everything written so far durable.
    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()>;

    /// Ends serving, once the last request is done and before the unmount: makes
    /// everything durable and lets go of what others wait for (an image's locks, its
    /// closing writes), so that whoever opens the same storage the moment the mount is
    /// gone finds it free and whole. Nothing is served after it. By default, [`flush`].
    ///
    /// [`flush`]: FileSystem::flush
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.flush(cx)
    }

    /// One line for logs, e.g. the image it exports.
    fn describe(&self) -> String;

    /// Whether no request can stall: every wait of `handle` is on local storage, bounded,
    /// never on another machine or FUSE server. Only then may a loop that had nothing else
    /// to do serve a request with blocking calls ([`Ctx::Blocking`]), holding the loop
    /// until it is done (`--idle-wait block`); else every request runs in a coroutine, as
    /// the contract above says. `false` by default.
    fn waits_are_bounded(&self) -> bool {
        false
    }

    /// Gives up on the requests in flight that wait for something outside the process
    /// (an image's NBD server): they fail now, so that a stop asked for again does not
    /// wait for a server that no longer answers. Nothing by default.
    fn abort(&self) {}
}
