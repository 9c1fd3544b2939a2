//! One request, whatever the transport: decode, run against the file system, reply.

use std::io;

use runtime::Ctx;
use serde::Serialize;

use crate::FileSystem;
use fuse::decode::header_of;
use fuse::reply::{classify_write_error, Sent};
use fuse::{Errno, Reply, Request};

/// How one request ended.
pub enum Served {
    /// A reply was written (or the kernel had already dropped the request).
    Replied(Sent),
    /// The operation takes no reply (FORGET, INTERRUPT...).
    NoReply,
    /// It could not be decoded (answered EIO when its header was readable).
    Malformed,
    /// Writing the reply failed.
    ReplyFailed,
}

/// Decodes the request in `head` (+ `tail`), runs it with `cx`, and sends its reply with
/// `send` (a writev of the reply's iovecs). Reply data (READ) goes into `data`
/// (page-aligned: see [`crate::buffers`]), handed on only to opcodes that need it.
pub fn serve_request<F: FileSystem>(
    fs: &F,
    cx: &Ctx<'_>,
    head: &[u8],
    tail: &[u8],
    data: &mut [u8],
    send: impl FnOnce(&Reply<'_>) -> io::Result<usize>,
) -> Served {
    let req = match Request::decode(head, tail) {
        Ok(req) => req,
        Err(e) => {
            log::warn!(
                "malformed request of {} bytes: {e}",
                head.len() + tail.len()
            );
            if let Some(h) = header_of(head) {
                let _ = deliver(&Reply::error(h.unique, Errno::EIO), send);
            }
            return Served::Malformed;
        }
    };
    log::trace!("{req}");
    let mut scratch = F::Scratch::default();
    let data = match req.op.kind().needs_data_buffer() {
        true => data,
        false => &mut [],
    };
    match fs.handle(cx, &req, &mut scratch, data) {
        Some(reply) => deliver(&reply, send),
        None => Served::NoReply,
    }
}

/// A read of `n` bytes, checked: the kernel hands over whole requests, so a read shorter
/// than a request header means the stream itself is unusable (not a malformed request,
/// which gets an error reply and the queue goes on).
pub fn whole_request(n: usize) -> io::Result<usize> {
    let header = std::mem::size_of::<fuse::abi::fuse_in_header>();
    if n < header {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a read returned {n} bytes, less than a request header ({header})"),
        ));
    }
    Ok(n)
}

fn deliver(reply: &Reply<'_>, send: impl FnOnce(&Reply<'_>) -> io::Result<usize>) -> Served {
    match send(reply)
        .map(|_| Sent::Delivered)
        .or_else(classify_write_error)
    {
        Ok(sent) => Served::Replied(sent),
        Err(e) => {
            log::warn!("reply to request {}: {e}", reply.header().unique);
            Served::ReplyFailed
        }
    }
}

/// What a queue did (for `--stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct QueueStats {
    /// Requests read from /dev/fuse.
    pub requests: u64,
    /// Replies written.
    pub replies: u64,
    /// Replies the kernel no longer wanted (request interrupted or aborted).
    pub replies_gone: u64,
    /// Requests that could not be decoded.
    pub malformed: u64,
    /// Reads of /dev/fuse that failed for another reason than the unmount, or returned
    /// less than a request header: the stream was unusable and the queue stopped.
    pub stream_errors: u64,
    /// Reads that found no request (`EAGAIN`) and waited for `POLLIN`.
    pub empty_reads: u64,
    /// Request buffers allocated (high-water mark of requests in flight plus readers).
    pub buffers_allocated: u64,
    /// Requests served without suspending, after which the coroutine that read them read
    /// the next one itself (coroutine transport): no spawn, no switch beyond the read.
    #[serde(default)]
    pub served_in_place: u64,
    /// Times the loop placement paused this queue, leaving the requests to the other
    /// loops ([`crate::placement`]).
    #[serde(default)]
    pub pauses: u64,
    /// Milliseconds this queue spent paused.
    #[serde(default)]
    pub paused_ms: u64,
    /// Requests read ahead into the backlog, to be started by turns with the other
    /// clients' (coroutine transport, [`crate::backlog`]).
    #[serde(default)]
    pub backlogged: u64,
    /// Reads of /dev/fuse that blocked the loop's thread, the loop having nothing else to
    /// do (`--idle-wait block`, [`crate::coroutine`]).
    #[serde(default)]
    pub blocked_reads: u64,
    /// Requests served with blocking system calls on the loop's thread, the loop having
    /// nothing else to do (`--idle-wait block`).
    #[serde(default)]
    pub served_blocking: u64,
    /// Times a request was found queued right after one served slowly with blocking calls, and
    /// the loop waited through its ring for a while (a deep client).
    #[serde(default)]
    pub deep_holds: u64,
}

impl QueueStats {
    /// Counts how a request ended.
    pub fn record(&mut self, served: &Served) {
        match served {
            Served::Replied(Sent::Delivered) => self.replies += 1,
            Served::Replied(Sent::Gone) => self.replies_gone += 1,
            Served::Malformed => self.malformed += 1,
            Served::NoReply | Served::ReplyFailed => {}
        }
    }

    /// Field-wise sum (several queues or workers).
    pub fn add(&mut self, other: &QueueStats) {
        self.requests += other.requests;
        self.replies += other.replies;
        self.replies_gone += other.replies_gone;
        self.malformed += other.malformed;
        self.stream_errors += other.stream_errors;
        self.empty_reads += other.empty_reads;
        self.buffers_allocated += other.buffers_allocated;
        self.served_in_place += other.served_in_place;
        self.pauses += other.pauses;
        self.paused_ms += other.paused_ms;
        self.backlogged += other.backlogged;
        self.blocked_reads += other.blocked_reads;
        self.served_blocking += other.served_blocking;
        self.deep_holds += other.deep_holds;
    }
}
