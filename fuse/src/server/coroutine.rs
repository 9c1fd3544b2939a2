//! The coroutine transport: /dev/fuse read through the loop's io_uring, one coroutine per
//! request (QEMU's design in its coroutine series).
//!
//! A queue keeps `readers` reads outstanding. When a read completes, its coroutine spawns
//! a replacement reader and then *becomes* the request's coroutine: it decodes, runs
//! [`Export::handle`] with [`Ctx::Coroutine`] (suspending on the backend's io_uring
//! operations), writes the reply, gives its buffers back and ends. So each request costs
//! one pooled spawn and no hand-off of buffers.
//!
//! /dev/fuse is opened `O_NONBLOCK` (required for io_uring reads): a read that finds no
//! request completes with `EAGAIN`, and the reader then waits for `POLLIN` through the ring
//! before reading again.
//!
//! Stopping ([`Queue::stop`]): no new reader is spawned, the outstanding reads are
//! cancelled, requests in flight finish and reply. A queue also ends by itself when the
//! file system is unmounted (reads fail with `ENODEV`).

use std::cell::{Cell, RefCell};
use std::io::{self, IoSliceMut};
use std::rc::Rc;
use std::sync::Arc;

use backend::Ctx;
use runtime::{Co, TaskId, WaitQueue};
use serde::Serialize;

use super::buffers::{Big, Buffers, Head};
use crate::abi::FUSE_READ;
use crate::decode::header_of;
use crate::dev::{classify_read, FuseDev, Received};
use crate::export::{Export, ReplyArgs};
use crate::reply::{classify_write_error, Sent};
use crate::{Errno, Reply, Request};

/// How a queue runs.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    /// Reads of /dev/fuse kept outstanding.
    pub readers: usize,
    /// Send replies through the ring (batched with the next submission) instead of a
    /// direct `writev(2)`.
    pub ring_replies: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            readers: 2,
            ring_replies: false,
        }
    }
}

/// What a queue did (for `--stats`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct QueueStats {
    /// Requests read from /dev/fuse.
    pub requests: u64,
    /// Replies written.
    pub replies: u64,
    /// Replies the kernel no longer wanted (request interrupted or aborted).
    pub replies_gone: u64,
    /// Requests that could not be decoded.
    pub malformed: u64,
    /// Reads that found no request (`EAGAIN`) and waited for `POLLIN`.
    pub empty_reads: u64,
    /// In-place buffers allocated (high-water mark of requests in flight plus readers).
    pub heads_allocated: u64,
    /// Large buffers allocated.
    pub bigs_allocated: u64,
}

/// One /dev/fuse fd served by coroutines of one event loop.
pub struct Queue {
    dev: FuseDev,
    export: Arc<Export>,
    config: QueueConfig,
    buffers: Buffers,
    stopping: Cell<bool>,
    /// Readers currently waiting on /dev/fuse, for cancellation at stop.
    readers: RefCell<Vec<TaskId>>,
    live_readers: Cell<usize>,
    in_flight: Cell<usize>,
    finished: WaitQueue,
    stats: RefCell<QueueStats>,
}

impl Queue {
    /// A queue on `dev` (which must be `O_NONBLOCK`) for requests of at most `max_write`
    /// bytes of data.
    pub fn new(
        dev: FuseDev,
        export: Arc<Export>,
        max_write: u32,
        config: QueueConfig,
    ) -> Rc<Queue> {
        Rc::new(Queue {
            dev,
            export,
            config,
            buffers: Buffers::new(max_write),
            stopping: Cell::new(false),
            readers: RefCell::new(Vec::new()),
            live_readers: Cell::new(0),
            in_flight: Cell::new(0),
            finished: WaitQueue::new(),
            stats: RefCell::new(QueueStats::default()),
        })
    }

    /// Starts the readers.
    pub fn start(self: &Rc<Self>, co: &Co<'_>) -> io::Result<()> {
        for _ in 0..self.config.readers.max(1) {
            self.spawn_reader(co)?;
        }
        Ok(())
    }

    /// Stops taking requests: cancels the outstanding reads; requests in flight finish.
    pub fn stop(&self, co: &Co<'_>) {
        if self.stopping.replace(true) {
            return;
        }
        let readers = std::mem::take(&mut *self.readers.borrow_mut());
        for id in readers {
            if let Err(e) = co.cancel_io(id) {
                log::warn!("cancelling a /dev/fuse read: {e}");
            }
        }
    }

    /// Suspends until the queue has no reader and no request left.
    pub fn wait_finished(&self, co: &Co<'_>) {
        while !self.is_finished() {
            self.finished.wait(co);
        }
    }

    fn is_finished(&self) -> bool {
        self.live_readers.get() == 0 && self.in_flight.get() == 0
    }

    /// What the queue did so far.
    pub fn stats(&self) -> QueueStats {
        let mut stats = *self.stats.borrow();
        stats.heads_allocated = self.buffers.heads.allocated();
        stats.bigs_allocated = self.buffers.bigs.allocated();
        stats
    }

    fn spawn_reader(self: &Rc<Self>, co: &Co<'_>) -> io::Result<()> {
        let queue = Rc::clone(self);
        self.live_readers.set(self.live_readers.get() + 1);
        let id = co.spawn_named("fuse-request", move |co| queue.reader(co));
        if id.is_err() {
            self.live_readers.set(self.live_readers.get() - 1);
        }
        self.readers.borrow_mut().push(id?);
        Ok(())
    }

    /// A reader's life: wait for one request, hand reading over to a new reader, serve it.
    fn reader(self: Rc<Self>, co: &Co<'_>) {
        let mut head = self.buffers.heads.take();
        let mut big = self.buffers.bigs.take();
        let received = self.receive(co, &mut head, &mut big);
        self.readers.borrow_mut().retain(|&id| id != co.id());
        self.live_readers.set(self.live_readers.get() - 1);
        match received {
            Ok(Some(n)) => {
                self.in_flight.set(self.in_flight.get() + 1);
                if !self.stopping.get() {
                    if let Err(e) = self.spawn_reader(co) {
                        log::error!("cannot start a /dev/fuse reader: {e}");
                    }
                }
                self.serve(co, &head, big, n);
                self.in_flight.set(self.in_flight.get() - 1);
            }
            Ok(None) => {
                self.stopping.set(true);
                self.buffers.bigs.give(big);
            }
            Err(e) => {
                log::error!("reading /dev/fuse: {e}; this queue stops");
                self.stopping.set(true);
                self.buffers.bigs.give(big);
            }
        }
        self.buffers.heads.give(head);
        if self.is_finished() {
            self.finished.wake_all(co);
        }
    }

    /// Reads one request; `None` once the queue stops or the file system is unmounted.
    fn receive(&self, co: &Co<'_>, head: &mut Head, big: &mut Big) -> io::Result<Option<usize>> {
        loop {
            if self.stopping.get() {
                return Ok(None);
            }
            let mut iov = [
                IoSliceMut::new(head.bytes_mut()),
                IoSliceMut::new(big.bytes_mut()),
            ];
            let result = co.readv(&self.dev, &mut iov);
            if matches!(&result, Err(e) if e.raw_os_error() == Some(libc::ECANCELED)) {
                return Ok(None);
            }
            let again = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EAGAIN));
            match classify_read(result)? {
                Received::Request(n) => {
                    self.stats.borrow_mut().requests += 1;
                    return Ok(Some(n));
                }
                Received::Unmounted => return Ok(None),
                Received::Retry if again => {
                    self.stats.borrow_mut().empty_reads += 1;
                    match co.poll(&self.dev, libc::POLLIN) {
                        Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return Ok(None),
                        Err(e) => return Err(e),
                        Ok(_) => {}
                    }
                }
                Received::Retry => {}
            }
        }
    }

    /// Serves one request of `n` bytes. The big buffer goes back to the pool at once unless
    /// the request uses it: as the rest of a large WRITE, or for READ data.
    fn serve(&self, co: &Co<'_>, head: &Head, mut big: Big, n: usize) {
        let in_head = n.min(head.bytes().len());
        if n > in_head {
            self.dispatch(co, head.bytes(), &big.bytes()[..n - in_head], &mut []);
        } else if header_of(head.bytes()).is_some_and(|h| h.opcode == FUSE_READ) {
            self.dispatch(co, &head.bytes()[..n], &[], big.bytes_mut());
        } else {
            self.buffers.bigs.give(big);
            self.dispatch(co, &head.bytes()[..n], &[], &mut []);
            return;
        }
        self.buffers.bigs.give(big);
    }

    /// Decodes a request, runs it against the export, and replies.
    fn dispatch(&self, co: &Co<'_>, head: &[u8], tail: &[u8], data: &mut [u8]) {
        let req = match Request::decode(head, tail) {
            Ok(req) => req,
            Err(e) => {
                self.stats.borrow_mut().malformed += 1;
                log::warn!(
                    "malformed request of {} bytes: {e}",
                    head.len() + tail.len()
                );
                if let Some(h) = header_of(head) {
                    self.send(co, &Reply::error(h.unique, Errno::EIO));
                }
                return;
            }
        };
        log::trace!("{req}");
        let mut args = ReplyArgs::default();
        if let Some(reply) = self
            .export
            .handle(&Ctx::Coroutine(co), &req, &mut args, data)
        {
            self.send(co, &reply);
        }
    }

    fn send(&self, co: &Co<'_>, reply: &Reply<'_>) {
        let slices = reply.io_slices();
        let written = if self.config.ring_replies {
            co.writev(&self.dev, &slices)
        } else {
            self.dev.writev(&slices)
        };
        let sent = written
            .map(|_| Sent::Delivered)
            .or_else(classify_write_error);
        let mut stats = self.stats.borrow_mut();
        match sent {
            Ok(Sent::Delivered) => stats.replies += 1,
            Ok(Sent::Gone) => stats.replies_gone += 1,
            Err(e) => log::warn!("reply to request {}: {e}", reply.header().unique),
        }
    }
}
