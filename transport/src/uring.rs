//! FUSE over io_uring (Linux 6.14+, `enable_uring=Y`): the kernel hands requests to ring
//! entries that we register, one set per possible CPU, and a request goes to the queue of
//! the CPU its caller runs on. No read(2) of /dev/fuse and no writev(2) per request: one
//! `URING_CMD` both commits a reply and fetches the next request, on the same ring that
//! does the backend I/O.
//!
//! # An entry's life
//! Each entry is a coroutine owning a 288-byte `fuse_uring_req_header` and a page-aligned
//! payload buffer (the largest request or reply: `max_write`). It REGISTERs them once
//! (the kernel keeps the two pointers), then loops: its command completes with 0 when a
//! request is in the buffers (`in_out` holds the `fuse_in_header`, `op_in` the first
//! argument struct, the payload the rest and `ring_ent_in_out.payload_sz` its size); the
//! entry serves it, writes the `fuse_out_header` into `in_out` and the reply's arguments
//! into the payload, and sends COMMIT_AND_FETCH with the request's `commit_id`.
//!
//! - WRITE data arrives at the start of the page-aligned payload and goes to the backend
//!   from there; READ data is read straight into the payload: no copy either way.
//! - Other requests are copied (header + first argument + payload, at most
//!   [`SMALL_REQUEST`] bytes) into a small aligned buffer for the decoder.
//! - `-EAGAIN`/`-EINTR` completions resubmit the same command.
//! - Stopping: io_uring cannot cancel a URING_CMD waiting for a request, so entries end
//!   only when the connection goes (unmount: every entry completes with `-ENOTCONN`) or
//!   the ring closes (process exit). At a stop the caller waits until no entry is serving
//!   a request ([`RingQueues::is_settled`]), flushes and unmounts.
//!
//! INTERRUPT, FORGET and notifications still use /dev/fuse: the caller keeps a
//! [`crate::Queue`] on it beside the ring.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;

use fuse::abi::*;
use fuse::dev::FuseDev;
use fuse::{Errno, OpKind, Reply, Request};
use runtime::Ctx;
use runtime::{Co, WaitQueue};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::accounting::{Accounting, RequestClock};
use crate::buffers::PageBuf;
use crate::dispatch::{QueueStats, Served};
use crate::uring_cmd::uring_cmd;
use crate::FileSystem;

/// Largest non-WRITE request the entry decodes (header + first argument + payload).
pub const SMALL_REQUEST: usize = 8192;
/// Largest reply argument that is not already in the payload buffer.
const STAGING: usize = 4096;

/// How the ring's queues are served.
#[derive(Clone, Copy, Debug)]
pub struct RingConfig {
    /// Entries registered per queue (per CPU).
    pub depth: usize,
    /// The negotiated `max_write`: the payload buffers' size.
    pub max_write: u32,
    /// Per-request accounting per opcode, as [`crate::QueueConfig::account`].
    pub account: bool,
}

/// The ring entries of the queues that one event loop serves.
pub struct RingQueues<F: FileSystem> {
    dev: FuseDev,
    fs: Arc<F>,
    config: RingConfig,
    stopping: Cell<bool>,
    live: Cell<usize>,
    /// Entries serving a request (between its arrival and their next command).
    busy: Cell<usize>,
    finished: WaitQueue,
    stats: RefCell<QueueStats>,
    /// The first unexpected error an entry ended with.
    failure: RefCell<Option<String>>,
    accounting: RefCell<Accounting>,
}

/// The possible CPUs: FUSE over io_uring needs one queue for each.
pub fn possible_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1).max(1)
}

impl<F: FileSystem> RingQueues<F> {
    /// Ring entries on `dev` (any /dev/fuse fd of the session) for `fs`.
    pub fn new(dev: FuseDev, fs: Arc<F>, config: RingConfig) -> Rc<Self> {
        Rc::new(RingQueues {
            dev,
            fs,
            config,
            stopping: Cell::new(false),
            live: Cell::new(0),
            busy: Cell::new(0),
            finished: WaitQueue::new(),
            stats: RefCell::new(QueueStats::default()),
            failure: RefCell::new(None),
            accounting: RefCell::new(Accounting::default()),
        })
    }

    /// Registers `depth` entries on each queue in `qids`.
    pub fn start(self: &Rc<Self>, co: &Co<'_>, qids: impl Iterator<Item = u16>) -> io::Result<()> {
        for qid in qids {
            for _ in 0..self.config.depth.max(1) {
                let me = Rc::clone(self);
                self.live.set(self.live.get() + 1);
                if let Err(e) = co.spawn_named("fuse-ring-entry", move |co| me.entry(co, qid)) {
                    self.live.set(self.live.get() - 1);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Stops taking part in new work where the kernel lets us: io_uring cannot cancel a
    /// URING_CMD that waits for a request (ASYNC_CANCEL does not reach it), so entries end
    /// only when the connection goes (unmount: `-ENOTCONN`) or the ring is closed (the
    /// process exits). Until then an entry that gets a request serves it; [`is_settled`]
    /// tells when none is serving one, after which the caller may unmount.
    ///
    /// [`is_settled`]: RingQueues::is_settled
    pub fn stop(&self) {
        self.stopping.set(true);
    }

    /// Whether no entry is serving a request now.
    pub fn is_settled(&self) -> bool {
        self.busy.get() == 0
    }

    /// Suspends until every entry has ended (stopped or unmounted).
    pub fn wait_finished(&self, co: &Co<'_>) {
        while self.live.get() > 0 {
            self.finished.wait(co);
        }
    }

    /// Why entries ended other than by stop or unmount, if one did: then requests would
    /// wait for entries that are gone, and the caller should stop serving.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// A copy of the per-opcode accounting so far (empty unless `RingConfig::account`).
    /// A request's sample counts its fetch-and-commit command as its one SQE and no
    /// syscall: the reply travels with the next command.
    pub fn accounting_copy(&self) -> Accounting {
        let mut copy = Accounting::default();
        copy.merge(&self.accounting.borrow());
        copy
    }

    /// What the entries did so far (`requests`, `replies`, `malformed`).
    pub fn stats(&self) -> QueueStats {
        *self.stats.borrow()
    }

    /// One entry: register, then serve and commit until stopped or unmounted.
    fn entry(self: Rc<Self>, co: &Co<'_>, qid: u16) {
        let mut header = fuse_uring_req_header::new_box_zeroed().expect("allocation");
        let payload_len = (self.config.max_write as usize).max(FUSE_MIN_READ_BUFFER);
        let mut payload = PageBuf::new(payload_len);
        let mut small = vec![0u64; SMALL_REQUEST / 8];
        let iov = [
            libc::iovec {
                iov_base: header.as_mut_bytes().as_mut_ptr().cast(),
                iov_len: size_of::<fuse_uring_req_header>(),
            },
            libc::iovec {
                iov_base: payload.bytes_mut().as_mut_ptr().cast(),
                iov_len: payload.bytes().len(),
            },
        ];
        let (mut cmd_op, mut commit_id) = (FUSE_IO_URING_CMD_REGISTER, 0);
        loop {
            if self.stopping.get() && cmd_op == FUSE_IO_URING_CMD_REGISTER {
                break; // never registered: nothing to commit
            }
            if cmd_op == FUSE_IO_URING_CMD_COMMIT_AND_FETCH {
                self.busy.set(self.busy.get() - 1);
            }
            let req = fuse_uring_cmd_req {
                flags: 0,
                commit_id,
                qid,
                padding: [0; 6],
            };
            // The kernel writes a fresh commit_id with every request; teardown completes
            // commands with 0 and writes nothing, which this marker tells apart. (It takes
            // the commit_id of a COMMIT from the SQE, not from here.)
            header.ring_ent_in_out.commit_id = 0;
            let register = cmd_op == FUSE_IO_URING_CMD_REGISTER;
            let entry = uring_cmd(self.dev.as_raw_fd(), cmd_op, &req, register.then_some(&iov));
            // SAFETY: `iov` lives on this coroutine's stack until the command is issued,
            // and the header and payload it points to live until this coroutine ends,
            // which is after the entry's last completion (it ends only on an error
            // completion, and the runtime drains every CQE before unwinding a stack).
            let result = unsafe { co.ctx().submit128(entry) };
            match result {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => {
                    if cmd_op == FUSE_IO_URING_CMD_COMMIT_AND_FETCH {
                        self.busy.set(self.busy.get() + 1); // the same command again
                    }
                    continue;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTCONN | libc::ECANCELED | libc::ENODEV)
                    ) =>
                {
                    break
                }
                Err(e) => {
                    let why = format!("FUSE ring entry of queue {qid}: {e}");
                    log::error!("{why}; it stops");
                    self.failure.borrow_mut().get_or_insert(why);
                    break;
                }
            }
            commit_id = header.ring_ent_in_out.commit_id;
            if commit_id == 0 {
                // No request in the buffers (seen while the connection is torn down): the
                // kernel would find no request to commit to, so the entry ends here.
                log::debug!("ring entry of queue {qid} ends: the connection is torn down");
                break;
            }
            cmd_op = FUSE_IO_URING_CMD_COMMIT_AND_FETCH;
            self.busy.set(self.busy.get() + 1);
            self.stats.borrow_mut().requests += 1;
            let clock = self.config.account.then(|| {
                let opcode = fuse_in_header::read_from_prefix(&header.in_out[..])
                    .map_or(0, |(h, _)| h.opcode);
                RequestClock::start(co, opcode)
            });
            let served = self.serve(co, &mut header, &mut payload, &mut small);
            self.stats.borrow_mut().record(&served);
            if let Some(clock) = clock {
                self.accounting.borrow_mut().record(&clock.finish(co, 0));
            }
        }
        self.live.set(self.live.get() - 1);
        if self.live.get() == 0 {
            self.finished.wake_all(co);
        }
    }

    /// Serves the request in `header` and `payload`, leaving the reply there.
    fn serve(
        &self,
        co: &Co<'_>,
        header: &mut fuse_uring_req_header,
        payload: &mut PageBuf,
        small: &mut [u64],
    ) -> Served {
        let Ok((h, _)) = fuse_in_header::read_from_prefix(&header.in_out[..]) else {
            return Served::Malformed;
        };
        let payload_sz = header.ring_ent_in_out.payload_sz as usize;
        let arg_len = (h.len as usize)
            .checked_sub(size_of::<fuse_in_header>() + payload_sz)
            .filter(|&n| n <= FUSE_URING_OP_IN_OUT_SZ && payload_sz <= payload.bytes().len());
        let Some(arg_len) = arg_len else {
            log::warn!(
                "ring request {} (opcode {}, {} bytes, payload {payload_sz}) has an impossible size",
                h.unique,
                h.opcode,
                h.len
            );
            return refuse(header, h.unique);
        };
        let fixed = size_of::<fuse_in_header>() + arg_len;
        let small = small.as_mut_bytes();
        small[..size_of::<fuse_in_header>()]
            .copy_from_slice(&header.in_out[..size_of::<fuse_in_header>()]);
        small[size_of::<fuse_in_header>()..fixed].copy_from_slice(&header.op_in[..arg_len]);
        let cx = Ctx::Coroutine(co);
        let mut scratch = F::Scratch::default();
        let mut staging = [0u8; STAGING];
        let (out, used) = if h.opcode == FUSE_WRITE {
            // The data stays in the page-aligned payload: the tail, no copy.
            let served = match Request::decode(&small[..fixed], &payload.bytes()[..payload_sz]) {
                Ok(req) => self.fs.handle(&cx, &req, &mut scratch, &mut []),
                Err(e) => Some(malformed(h.unique, &e)),
            };
            stage(served, &mut staging, None)
        } else {
            if fixed + payload_sz > small.len() {
                log::warn!("ring request {} of {} bytes is too large", h.unique, h.len);
                return refuse(header, h.unique);
            }
            small[fixed..fixed + payload_sz].copy_from_slice(&payload.bytes()[..payload_sz]);
            let data: &mut [u8] = match OpKind::from_opcode(h.opcode).needs_data_buffer() {
                true => payload.bytes_mut(),
                false => &mut [],
            };
            let base = data.as_ptr() as usize;
            let served = match Request::decode(&small[..fixed + payload_sz], &[]) {
                Ok(req) => self.fs.handle(&cx, &req, &mut scratch, data),
                Err(e) => Some(malformed(h.unique, &e)),
            };
            stage(served, &mut staging, Some(base))
        };
        match out {
            None => Served::NoReply,
            Some((out_header, in_payload)) => {
                let n = match in_payload {
                    Some(n) => n,
                    None => {
                        payload.bytes_mut()[..used].copy_from_slice(&staging[..used]);
                        used
                    }
                };
                write_header(header, &out_header, n);
                Served::Replied(fuse::Sent::Delivered)
            }
        }
    }
}

/// An EIO reply for a request that does not decode.
fn malformed(unique: u64, e: &fuse::DecodeError) -> Reply<'static> {
    log::warn!("malformed ring request {unique}: {e}");
    Reply::error(unique, Errno::EIO)
}

/// What to put in the entry for `reply`: its header, and either the length of data it
/// already has at the start of the payload (`payload_base`), or its arguments copied into
/// `staging` (returned as the used length).
fn stage(
    reply: Option<Reply<'_>>,
    staging: &mut [u8; STAGING],
    payload_base: Option<usize>,
) -> (Option<(fuse_out_header, Option<usize>)>, usize) {
    let Some(reply) = reply else {
        return (None, 0);
    };
    let slices = reply.io_slices();
    let args = &slices[1..];
    let mut out_header = *reply.header();
    if let ([only], Some(base)) = (args, payload_base) {
        if only.as_ptr() as usize == base {
            return (Some((out_header, Some(only.len()))), 0);
        }
    }
    let total: usize = args.iter().map(|s| s.len()).sum();
    if total > STAGING {
        log::error!(
            "reply to {} of {total} bytes does not fit the ring entry",
            out_header.unique
        );
        out_header = *Reply::error(out_header.unique, Errno::EIO).header();
        return (Some((out_header, None)), 0);
    }
    let mut at = 0;
    for s in args {
        staging[at..at + s.len()].copy_from_slice(s);
        at += s.len();
    }
    (Some((out_header, None)), at)
}

/// Writes `out` into the entry's `in_out` and the payload size.
fn write_header(header: &mut fuse_uring_req_header, out: &fuse_out_header, payload_sz: usize) {
    let bytes = out.as_bytes();
    header.in_out[..bytes.len()].copy_from_slice(bytes);
    header.ring_ent_in_out.payload_sz = payload_sz as u32;
}

/// Leaves an EIO reply to `unique` (no arguments) in the entry, for a request it could
/// not take.
fn refuse(header: &mut fuse_uring_req_header, unique: u64) -> Served {
    write_header(header, Reply::error(unique, Errno::EIO).header(), 0);
    Served::Malformed
}
