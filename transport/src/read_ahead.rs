//! When a coroutine queue reads ahead into its backlog ([`crate::backlog`]), and how much:
//! the part of serving clients by turns that finds the client to serve first.
//!
//! Why a policy: reading ahead costs. Each drain ends with a read that finds nothing, and
//! fills up to [`BACKLOG`] buffers (the cache). It pays only when a *shallow* client (one
//! request at a time, iodepth 1) waits behind a *deep* one (iodepth 64); between clients
//! alike, arrival order serves them as well. So a queue probes, [`PROBE_READS`] requests
//! every [`PROBE_EVERY`]; a probe that finds a client's only request behind
//! [`VICTIM_BEHIND`] others ([`Backlog::victim`]) makes it the shallow client, and the
//! queue drains every [`DRAIN_EVERY`], up to [`BACKLOG`], until the client has sent
//! nothing for [`SHALLOW_GONE`] requests or has [`NOT_SHALLOW`] waiting. Large requests
//! are not read ahead ([`DRAIN_BYTES`]). The other rules
//! tried, and what they cost: benches/HISTORY.md, "The backlog: when to drain".
//!
//! The shallow client is the session's, not one loop's: its handle is shared by every
//! loop's queue ([`ReadAhead::share`]), so that each serves it by turns and counts its
//! requests [`SHALLOW_WEIGHT`] times for the loop placement ([`crate::placement`]), which
//! then keeps the loops that serve it best.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuse::abi::{fuse_in_header, fuse_read_in, FUSE_READ};
use fuse::decode::header_of;
use zerocopy::FromBytes;

use crate::backlog::{Backlog, Turn};

/// Requests a queue takes from /dev/fuse ahead of serving them, at most: the iodepth of a
/// deep client (they are in flight for it anyway, each with its buffer).
pub const BACKLOG: usize = 64;

/// A drain stops once the requests it read move this many bytes ([`bytes_moved`]), and a
/// request that moves more than [`SMALL_REQUEST`] starts none: the loop that drains
/// requests serves them, and copies their data one after another where two loops copied
/// two at once. A WRITE's data is copied as it is read (fio, 1 MiB writes at qd4: 0.83x on
/// null, 0.90x on tmpfs, 0.70x on ext4 with 2 jobs, against no backlog), a READ's when
/// its reply is written (fio, 1 MiB reads at qd4, 4 rounds: on null 11.0-12.6k IOPS while
/// drains counted a READ's 80 bytes, 12.4-13.2k since, `threads:2` 12.1-12.4k; on tmpfs
/// medians 6.6k, 7.1k and 7.1k).
pub const DRAIN_BYTES: usize = 256 << 10;

/// The most bytes a request that starts a drain may move (see [`DRAIN_BYTES`]).
pub const SMALL_REQUEST: usize = 64 << 10;

/// The bytes serving `request` copies between the kernel and the loop: a READ's `size`
/// (its reply's data), else the request itself (a WRITE's data comes with it).
pub fn bytes_moved(request: &[u8]) -> usize {
    let args = request
        .get(std::mem::size_of::<fuse_in_header>()..)
        .unwrap_or_default();
    match (
        header_of(request).map(|h| h.opcode),
        fuse_read_in::read_from_prefix(args),
    ) {
        (Some(FUSE_READ), Ok((read, _))) => read.size as usize,
        _ => request.len(),
    }
}

/// How often, at most, a queue that keeps finding requests queued takes all of them into
/// its backlog (each time costs one read that finds nothing). A request that arrives
/// behind a deep client's waits at most this long in the kernel, plus the request being
/// served.
pub const DRAIN_EVERY: Duration = Duration::from_micros(10);

/// How often a queue drains to look for a shallow client behind a deep one while it
/// knows none: clients alike (several at iodepth 1, or several at 64) are served as well
/// in arrival order, and would pay the backlog's reads (and its buffers in the cache) for
/// nothing; fio, null, two jobs at iodepth 64: 0.75-0.9x with a drain every
/// [`DRAIN_EVERY`].
pub const PROBE_EVERY: Duration = Duration::from_millis(1);

/// Requests a drain takes at most while no shallow client is known: enough to find one
/// behind [`VICTIM_BEHIND`] of a deep one's now and then, few enough that clients alike
/// keep using a couple of buffers.
pub const PROBE_READS: usize = 16;

/// A drain finds a shallow client when its one request waits behind this many of others
/// ([`Backlog::victim`]); more than a few clients at iodepth 1 queue together.
pub const VICTIM_BEHIND: usize = 8;

/// A shallow client is known (and the queue drains every [`DRAIN_EVERY`]) until this many
/// requests of others came without one of its own.
pub const SHALLOW_GONE: u32 = 65536;

/// A client found shallow once is known not to be when a drain finds this many of its
/// requests waiting: a client at iodepth 1 never has two. Two deep clients look like a
/// shallow one beside a deep one now and then (fio at iodepth 64 submits in bursts).
pub const NOT_SHALLOW: usize = 3;

/// Each request of the shallow client counts this many times among the requests the loop
/// placement weighs its trials by ([`crate::Queue::count_into`]): the placement then
/// keeps the loops that serve the shallow client best, even at some cost to the deep
/// one. Two busy loops and two clients on 2 CPUs: the shallow client's p99 2-5x its p99
/// alone; one loop: within 1x, at 0.65x the deep client's IOPS (fio, null, 2026-12-06).
pub const SHALLOW_WEIGHT: u64 = 16;

/// A handle seen with two requests waiting at once is deep (a client at iodepth 1 never
/// has two), and no probe takes it for the shallow client for this long after: four
/// clients at iodepth 64 each showed a lone request behind the others' now and then, and
/// were taken for a shallow client ~150 times a second, each time draining every
/// [`DRAIN_EVERY`] until a drain found [`NOT_SHALLOW`] of its requests (fio, null, 4
/// jobs at iodepth 64: 0.8x of `threads:2`, 43% of requests through the backlog).
pub const DEEP_MEMORY: Duration = Duration::from_secs(1);

/// Deep handles a queue remembers ([`DEEP_MEMORY`]); a new one replaces the oldest.
pub const DEEP_REMEMBERED: usize = 8;

/// No shallow client, in [`ReadAhead::share`]'s handle.
pub const NO_CLIENT: u64 = u64::MAX;

/// One queue's read-ahead state.
pub struct ReadAhead {
    /// When the last drain started.
    drained_at: Cell<Instant>,
    /// The shallow client's file handle ([`NO_CLIENT`] if none), shared with the
    /// session's other queues.
    shallow: RefCell<Arc<AtomicU64>>,
    /// The thread id of the shallow client's last request (0: none seen), shared too:
    /// the loop placement follows its CPU.
    shallow_pid: RefCell<Arc<AtomicU32>>,
    /// Requests this queue read since the shallow client's last ([`SHALLOW_GONE`]).
    since_shallow: Cell<u32>,
    /// Handles seen deep, and when last ([`DEEP_MEMORY`]).
    deep: RefCell<[Option<(u64, Instant)>; DEEP_REMEMBERED]>,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead::new()
    }
}

impl ReadAhead {
    /// No shallow client known, the first probe due after [`PROBE_EVERY`].
    pub fn new() -> ReadAhead {
        ReadAhead {
            drained_at: Cell::new(Instant::now()),
            shallow: RefCell::new(Arc::new(AtomicU64::new(NO_CLIENT))),
            shallow_pid: RefCell::new(Arc::new(AtomicU32::new(0))),
            since_shallow: Cell::new(0),
            deep: RefCell::new([None; DEEP_REMEMBERED]),
        }
    }

    /// Shares the shallow client with other queues: `handle` holds its file handle, or
    /// [`NO_CLIENT`] for none ([`crate::placement::Placement::shallow_client`]).
    pub fn share(&self, handle: Arc<AtomicU64>) {
        *self.shallow.borrow_mut() = handle;
    }

    /// Shares where the thread id of the shallow client's requests goes
    /// ([`crate::placement::Placement::shallow_pid`]).
    pub fn share_pid(&self, pid: Arc<AtomicU32>) {
        *self.shallow_pid.borrow_mut() = pid;
    }

    /// The shallow client's file handle, if one is known.
    pub fn shallow(&self) -> Option<u64> {
        let fh = self.shallow.borrow().load(Ordering::Relaxed);
        (fh != NO_CLIENT).then_some(fh)
    }

    fn set_shallow(&self, fh: Option<u64>) {
        self.since_shallow.set(0);
        let fh = fh.unwrap_or(NO_CLIENT);
        self.shallow.borrow().store(fh, Ordering::Relaxed);
    }

    /// How many times `request` (just read) counts for the loop placement:
    /// [`SHALLOW_WEIGHT`] for the shallow client's, else 1. Forgets the shallow client
    /// once this queue read [`SHALLOW_GONE`] requests without one of its.
    pub fn weigh(&self, request: &[u8]) -> u64 {
        let Some(shallow) = self.shallow() else {
            return 1;
        };
        if Turn::of(request) == Turn::Handle(shallow) {
            self.since_shallow.set(0);
            if let Some(h) = header_of(request) {
                self.shallow_pid.borrow().store(h.pid, Ordering::Relaxed);
            }
            return SHALLOW_WEIGHT;
        }
        if self.since_shallow.replace(self.since_shallow.get() + 1) >= SHALLOW_GONE {
            self.set_shallow(None);
        }
        1
    }

    /// Whether `request`, just read after another was served, starts a drain: it moves
    /// little data ([`SMALL_REQUEST`], [`bytes_moved`]) and one is [`due`](Self::due).
    pub fn starts_drain(&self, request: &[u8]) -> bool {
        bytes_moved(request) <= SMALL_REQUEST && self.due()
    }

    /// Whether a drain is due: [`DRAIN_EVERY`] since the last one while a shallow client
    /// is known, else [`PROBE_EVERY`].
    pub fn due(&self) -> bool {
        let every = match self.shallow() {
            Some(_) => DRAIN_EVERY,
            None => PROBE_EVERY,
        };
        self.drained_at.get().elapsed() >= every
    }

    /// A drain starts: how many requests the backlog may hold by its end ([`BACKLOG`], or
    /// [`PROBE_READS`] while no shallow client is known).
    pub fn start(&self) -> usize {
        self.drained_at.set(Instant::now());
        match self.shallow() {
            Some(_) => BACKLOG,
            None => PROBE_READS,
        }
    }

    /// A drain ended with `backlog`: the handles with two requests waiting are deep for
    /// [`DEEP_MEMORY`]; a shallow client behind a deep one, found now and not known deep,
    /// is the session's; the known one, with [`NOT_SHALLOW`] requests waiting, is not.
    pub fn judge<T>(&self, backlog: &Backlog<T>) {
        let now = Instant::now();
        let counts = backlog.handle_counts();
        for (fh, _) in counts.iter().filter(|&(_, n)| n >= 2) {
            self.seen_deep(fh, now);
        }
        match self.shallow() {
            None => {
                let known_deep = |fh| self.known_deep(fh, now);
                if let Some(fh) = backlog.victim(&counts, VICTIM_BEHIND, known_deep) {
                    log::debug!("a shallow client (fh {fh:#x}) behind a deep one: served by turns");
                    self.set_shallow(Some(fh));
                }
            }
            Some(fh) if backlog.count(fh) >= NOT_SHALLOW => {
                log::debug!("fh {fh:#x} has {NOT_SHALLOW} requests waiting: not shallow");
                self.set_shallow(None);
            }
            Some(_) => {}
        }
    }

    /// Remembers `fh` as deep at `now`, in its own entry, else a free or the oldest one.
    fn seen_deep(&self, fh: u64, now: Instant) {
        let mut deep = self.deep.borrow_mut();
        let slot = match deep.iter().position(|e| e.is_some_and(|(h, _)| h == fh)) {
            Some(i) => i,
            None => (0..DEEP_REMEMBERED)
                .min_by_key(|&i| deep[i].map(|(_, at)| at))
                .expect("entries"),
        };
        deep[slot] = Some((fh, now));
    }

    /// Whether `fh` was seen deep within [`DEEP_MEMORY`] of `now`.
    fn known_deep(&self, fh: u64, now: Instant) -> bool {
        self.deep
            .borrow()
            .iter()
            .flatten()
            .any(|&(h, at)| h == fh && now.duration_since(at) < DEEP_MEMORY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_of(fh: u64) -> Vec<u8> {
        let header = std::mem::size_of::<fuse::abi::fuse_in_header>();
        let mut request = vec![0u8; header + 40];
        request[4..8].copy_from_slice(&fuse::abi::FUSE_READ.to_ne_bytes());
        request[header..header + 8].copy_from_slice(&fh.to_ne_bytes());
        request
    }

    #[test]
    fn a_probe_finds_the_shallow_client_and_its_requests_weigh_more() {
        let read_ahead = ReadAhead::new();
        assert_eq!(read_ahead.start(), PROBE_READS);
        let mut backlog = Backlog::with_capacity(BACKLOG);
        for _ in 0..VICTIM_BEHIND {
            backlog.push(Turn::Handle(0), ());
        }
        backlog.push(Turn::Handle(256), ());
        read_ahead.judge(&backlog);
        assert_eq!(read_ahead.shallow(), Some(256));
        assert_eq!(read_ahead.start(), BACKLOG, "drains take all now");
        assert_eq!(read_ahead.weigh(&read_of(256)), SHALLOW_WEIGHT);
        assert_eq!(read_ahead.weigh(&read_of(0)), 1);
    }

    #[test]
    fn a_client_seen_deep_is_not_taken_for_a_shallow_one() {
        let read_ahead = ReadAhead::new();
        let mut backlog = Backlog::with_capacity(BACKLOG);
        backlog.push(Turn::Handle(256), ());
        backlog.push(Turn::Handle(256), ());
        backlog.push(Turn::Handle(0), ());
        read_ahead.judge(&backlog);
        assert_eq!(read_ahead.shallow(), None, "nobody behind anybody yet");

        let mut later = Backlog::with_capacity(BACKLOG);
        for _ in 0..VICTIM_BEHIND {
            later.push(Turn::Handle(0), ());
        }
        later.push(Turn::Handle(256), ());
        read_ahead.judge(&later);
        assert_eq!(
            read_ahead.shallow(),
            None,
            "256 had two waiting a moment ago"
        );

        later.push(Turn::Handle(512), ());
        read_ahead.judge(&later);
        assert_eq!(read_ahead.shallow(), Some(512), "512 never had two");
    }

    #[test]
    fn deep_handles_beyond_the_memory_replace_the_oldest() {
        let read_ahead = ReadAhead::new();
        let start = Instant::now();
        for fh in 0..=DEEP_REMEMBERED as u64 {
            read_ahead.seen_deep(fh, start + Duration::from_millis(fh));
        }
        let now = start + Duration::from_millis(100);
        assert!(!read_ahead.known_deep(0, now), "the oldest went");
        assert!((1..=DEEP_REMEMBERED as u64).all(|fh| read_ahead.known_deep(fh, now)));
        assert!(!read_ahead.known_deep(1, start + DEEP_MEMORY + Duration::from_millis(2)));
    }

    #[test]
    fn a_client_with_requests_waiting_is_not_shallow() {
        let read_ahead = ReadAhead::new();
        let shared = Arc::new(AtomicU64::new(256));
        read_ahead.share(Arc::clone(&shared));
        let mut backlog = Backlog::with_capacity(BACKLOG);
        for _ in 0..NOT_SHALLOW {
            backlog.push(Turn::Handle(256), ());
        }
        read_ahead.judge(&backlog);
        assert_eq!(read_ahead.shallow(), None);
        assert_eq!(shared.load(Ordering::Relaxed), u64::MAX, "for every queue");
    }

    #[test]
    fn a_read_moves_its_size_and_a_write_its_length() {
        let header = std::mem::size_of::<fuse::abi::fuse_in_header>();
        let mut read = read_of(7);
        read[header + 16..header + 20].copy_from_slice(&(1u32 << 20).to_ne_bytes());
        assert_eq!(bytes_moved(&read), 1 << 20);
        let mut write = read.clone();
        write[4..8].copy_from_slice(&fuse::abi::FUSE_WRITE.to_ne_bytes());
        write.resize(header + 40 + 4096, 0);
        assert_eq!(bytes_moved(&write), header + 40 + 4096);
        assert_eq!(
            bytes_moved(&read[..header + 8]),
            header + 8,
            "a short READ: its length"
        );
    }

    #[test]
    fn a_shallow_client_that_stops_sending_is_forgotten() {
        let read_ahead = ReadAhead::new();
        read_ahead.set_shallow(Some(256));
        for _ in 0..SHALLOW_GONE {
            read_ahead.weigh(&read_of(0));
        }
        assert_eq!(read_ahead.shallow(), Some(256));
        read_ahead.weigh(&read_of(0));
        assert_eq!(read_ahead.shallow(), None);
    }
}
