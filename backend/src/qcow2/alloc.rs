//! Host cluster allocation, ordered so that a daemon killed at any point leaves at worst
//! leaked clusters (refcount 1, referenced by nothing): never a cluster referenced twice,
//! never an L2 entry to a cluster whose refcount is 0.
//!
//! - **Reserve before use.** Clusters are handed out from a reservation: a batch (up to
//!   32 to 256 MiB, at most [`BATCH`] clusters) whose refcounts were set to 1 and made durable
//!   before any of them is handed out. The caller writes the data, and only then the L2
//!   (or L1) entry that references it. So an entry on disk always points to a cluster
//!   whose refcount on disk is already 1; a kill (or a power loss) between leaks the
//!   reservation's unused clusters. A batch at the end of the file is one run in one
//!   refcount block, written with `RWF_DSYNC` after the file was extended over it: that
//!   write (and the size) is durable when it returns, without writing back the image's
//!   other dirty pages as an `fdatasync` would. Free clusters reused from below the end
//!   are set one write each and then made durable with one `fdatasync`.
//! - **Refill ahead.** When a request takes a cluster and leaves fewer than half a batch,
//!   it reserves the next batch (once: one refill at a time) before going on, while the
//!   others keep taking from what is left. (A refill coroutine of its own, tried, would
//!   leave the backend's drop waiting on the loop it runs on.) The reservation holds
//!   at most one and a half batches, the most a kill leaks. What is left goes back
//!   (refcount 0) when the backend is dropped.
//! - **Batch size.** 32 MiB; while refills come less than a second apart (an image being
//!   filled: `qemu-img convert`, an install), each doubles it, up to 256 MiB, so that such
//!   a fill waits for the host's journal a few times rather than once per 32 MiB. Only
//!   v3 images grow it: a killed daemon leaves them with their DIRTY bit set, and the
//!   next writable open reclaims the leak (`repair.rs`); v2 images, which cannot say so,
//!   keep 32 MiB and their leaks.
//! - **Free after unlink, after flush.** A cluster that an L2 entry stopped referencing
//!   (discard, zeroing, a copy-on-write of a compressed or shared cluster) waits in
//!   `pending` until the next flush has made the unlink durable; only then does its
//!   refcount drop and it may be reused. Reusing it earlier could, after a power loss,
//!   leave the old entry pointing to someone else's data. A cluster left with no
//!   reference then has its host space punched, so that discards give the space back.
//! - **Where.** Free clusters (refcount 0) below the end of the image, found by a scan of
//!   the refcount blocks at open and added to by frees, are reused first; then clusters are
//!   appended at the end (`end`, past everything with a refcount), and the file is extended
//!   to cover the reservation so that data writes into it never extend the file.
//! - **New refcount blocks** are placed at the first cluster they cover, so that each one
//!   counts itself: written (with its own refcount 1) and synced before the table entry
//!   that links it. A full refcount table is grown (`reftable.rs`).
//!
//! The allocator runs one operation at a time (its own lock, held across its I/O); data
//! I/O never happens under it, requests that find their clusters allocated never take it,
//! and one that takes a reserved cluster does not either (the reservation has its own
//! lock, never held across I/O). The batch is large so that refills are rare: with 1 MiB
//! batches (16 clusters of 64 KiB) and an `fdatasync` each, 4 KiB allocating writes at
//! iodepth 64 ran at 3,100 IOPS.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::range_lock::{Mode, RangeLocks, Span};
use crate::Ctx;

use super::hostio::Host;
use super::refcount::Refcounts;
use super::reftable;

/// Clusters reserved at most at once.
const BATCH: u64 = 4096;
/// Bytes reserved at once: to begin with, and at most (a fill, see [`Allocator::grow_batch`]).
const BATCH_BYTES: u64 = 32 << 20;
const MAX_BATCH_BYTES: u64 = 256 << 20;
/// Refills closer together than this double the batch; one after a longer pause resets it.
const FILLING: Duration = Duration::from_secs(1);
/// Free clusters remembered from the open-time scan, at most.
const MAX_FREE: usize = 1 << 20;

/// A refcount structure about to be put in force, with its free clusters and its end
/// ([`Allocator::prepare`]).
pub(crate) struct NewRefcounts {
    refcounts: Refcounts,
    free: Vec<u64>,
    end: u64,
}

/// A cluster handed out by [`Allocator::cluster`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewCluster {
    /// Host offset.
    pub(crate) at: u64,
    /// It lay past the end of the file when reserved (the file was extended over it), so
    /// it reads as zeroes: the caller need not write the zeroes of a partial write.
    pub(crate) zeroed: bool,
}

struct State {
    refcounts: Refcounts,
    /// First cluster index past everything that has a refcount (or a reservation).
    end: u64,
    /// Clusters with refcount 0 below `end`.
    free: Vec<u64>,
    /// A cluster of scratch bytes for refcount runs and new blocks.
    scratch: Box<[u8]>,
}

/// The allocator of one writable image.
pub(crate) struct Allocator {
    /// Locked under `serial` only, and then held across I/O.
    state: Mutex<State>,
    /// Reserved clusters (refcount 1 on disk, durable), handed out from the back (locked
    /// briefly, by anyone, never across I/O).
    reserved: Mutex<Vec<NewCluster>>,
    /// A request is reserving ahead of need.
    refilling: AtomicBool,
    /// Clusters the next refill reserves (see [`Allocator::grow_batch`]).
    batch: AtomicU64,
    /// The most it may grow to.
    max_batch: u64,
    /// When the last refill began (under `serial`).
    last_refill: Mutex<Option<Instant>>,
    /// Clusters to drop one reference of after the next flush (locked briefly, by anyone).
    pending: Mutex<Vec<u64>>,
    /// One operation at a time (a one-span [`RangeLocks`]: waits without blocking a loop).
    serial: RangeLocks,
    cluster_bits: u32,
}

impl Allocator {
    /// Scans the refcount blocks for free clusters below the end of the file (`file_len`).
    /// `fills`: the batch may grow up to [`MAX_BATCH_BYTES`] while the image fills fast
    /// (else it stays at [`BATCH_BYTES`]).
    pub(crate) fn open(
        cx: &Ctx<'_>,
        host: &Host,
        refcounts: Refcounts,
        file_len: u64,
        cluster_bits: u32,
        fills: bool,
    ) -> io::Result<Allocator> {
        let mut scratch = vec![0u8; 1usize << cluster_bits].into_boxed_slice();
        let (free, end) = scan(cx, host, &refcounts, file_len, cluster_bits, &mut scratch)?;
        let state = State {
            refcounts,
            end,
            free,
            scratch,
        };
        let clusters = |bytes: u64| (bytes >> cluster_bits).clamp(1, BATCH);
        let max_batch = clusters(if fills { MAX_BATCH_BYTES } else { BATCH_BYTES });
        Ok(Allocator {
            state: Mutex::new(state),
            reserved: Mutex::new(Vec::with_capacity(max_batch as usize * 3 / 2)),
            refilling: AtomicBool::new(false),
            batch: AtomicU64::new(clusters(BATCH_BYTES)),
            max_batch,
            last_refill: Mutex::new(None),
            pending: Mutex::default(),
            serial: RangeLocks::default(),
            cluster_bits,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reserved(&self) -> std::sync::MutexGuard<'_, Vec<NewCluster>> {
        self.reserved.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn serial(&self, cx: &Ctx<'_>) -> impl Drop + '_ {
        self.serial
            .lock(cx, Span { start: 0, end: 1 }, Mode::Exclusive)
    }

    /// A cluster with refcount 1 on disk (durable) that nothing references: the caller
    /// writes it, then links it.
    pub(crate) fn cluster(&self, cx: &Ctx<'_>, host: &Host) -> io::Result<NewCluster> {
        // The common case: a cluster of the reservation, handed out without waiting for
        // anyone (the reservation's lock is never held across I/O).
        let (taken, left) = {
            let mut r = self.reserved();
            (r.pop(), r.len() as u64)
        };
        if let Some(c) = taken {
            if left < self.batch() / 2 && !self.refilling.swap(true, Ordering::AcqRel) {
                self.refill_ahead(cx, host);
            }
            return Ok(c);
        }
        let _serial = self.serial(cx);
        if let Some(c) = self.reserved().pop() {
            return Ok(c);
        }
        self.reserve(cx, host)?;
        let c = self.reserved().pop();
        Ok(c.expect("reserve reserves one at least"))
    }

    /// Up to `max` clusters that follow each other in the file, as [`Allocator::cluster`]
    /// gives one: the first's host offset and how many (one at least).
    pub(crate) fn run(&self, cx: &Ctx<'_>, host: &Host, max: u64) -> io::Result<(u64, u64)> {
        let first = self.cluster(cx, host)?.at;
        let mut n = 1;
        let mut r = self.reserved();
        while n < max {
            match r.last() {
                Some(c) if c.at == first + (n << self.cluster_bits) => {
                    r.pop();
                    n += 1;
                }
                _ => break,
            }
        }
        Ok((first, n))
    }

    /// Clusters per batch now.
    fn batch(&self) -> u64 {
        self.batch.load(Ordering::Relaxed)
    }

    /// Sizes the batch for the refill beginning now (under `serial`): refills less than
    /// [`FILLING`] apart double it, up to `max_batch`, so that an image filling fast (a
    /// `qemu-img convert`, an install) makes its refcounts durable, and waits for the host
    /// file system's journal, a few times instead of once per 32 MiB; a pause sets it back.
    /// A kill leaks at most one and a half batches, which the next open reclaims where the
    /// image can say it was left open (v3, `repair.rs`); otherwise the batch stays small.
    fn grow_batch(&self) {
        let now = Instant::now();
        let mut last = self.last_refill.lock().unwrap_or_else(|e| e.into_inner());
        let base = (BATCH_BYTES >> self.cluster_bits).clamp(1, BATCH);
        let next = match *last {
            Some(t) if now.duration_since(t) < FILLING => (self.batch() * 2).min(self.max_batch),
            _ => base,
        };
        self.batch.store(next, Ordering::Relaxed);
        *last = Some(now);
    }

    /// Reserves the next batch while the reservation still has clusters to hand out, if
    /// less than half of one is left; the caller set `refilling`. A failure (ENOSPC, EIO)
    /// is left to the request that finds the reservation empty: it tries again and
    /// returns the error.
    fn refill_ahead(&self, cx: &Ctx<'_>, host: &Host) {
        /// Clears `refilling` however the refill ends (a coroutine dropped at shutdown
        /// unwinds through here).
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _done = Done(&self.refilling);
        let _serial = self.serial(cx);
        if (self.reserved().len() as u64) < self.batch() / 2 {
            if let Err(e) = self.reserve(cx, host) {
                log::debug!("qcow2: reserving clusters ahead of need: {e}");
            }
        }
    }

    fn new_cluster(&self, index: u64, zeroed: bool) -> NewCluster {
        NewCluster {
            at: index << self.cluster_bits,
            zeroed,
        }
    }

    /// Adds a batch to the reservation, its refcounts durable: free clusters first, else
    /// a run at the end. The caller holds `serial`.
    fn reserve(&self, cx: &Ctx<'_>, host: &Host) -> io::Result<()> {
        self.grow_batch();
        let want = self.batch();
        let mut s = self.state();
        let s = &mut *s; // no other holder: the serial lock is ours
        let mut picked = Vec::new(); // at most a batch, once per batch
        while (picked.len() as u64) < want {
            match s.free.pop() {
                Some(c) => picked.push(c),
                None => break,
            }
        }
        let batch: Vec<NewCluster> = if !picked.is_empty() {
            for &c in &picked {
                s.refcounts.set_run(cx, host, c, 1, 1, &mut s.scratch)?;
            }
            host.file.flush(cx)?; // refcounts durable before anything links the clusters
            picked
                .into_iter()
                .rev()
                .map(|c| self.new_cluster(c, false))
                .collect()
        } else {
            self.reserve_at_end(cx, host, s, want)?
        };
        // Behind what is left (handed out from the back): lowest first still.
        self.reserved().splice(0..0, batch);
        Ok(())
    }

    /// Reserves up to `want` clusters from `s.end` on, making a refcount block first where
    /// none covers `s.end`: extends the file over them, then writes their refcounts with
    /// `RWF_DSYNC` (durable with the new size). Returns them, the last first.
    fn reserve_at_end(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        s: &mut State,
        want: u64,
    ) -> io::Result<Vec<NewCluster>> {
        let per_block = s.refcounts.per_block();
        if s.refcounts.block_of(s.end).is_none() {
            self.new_block(cx, host, s)?;
        }
        let first = s.end;
        let count = want.min(per_block - first % per_block);
        let file_len = host.file.len();
        let len = (first + count) << self.cluster_bits;
        if len > file_len {
            host.file.resize(cx, len)?;
        }
        s.refcounts
            .set_run_durable(cx, host, first, count, 1, &mut s.scratch)?;
        s.end = first + count;
        let run = (first..first + count).rev();
        Ok(run
            .map(|c| self.new_cluster(c, c << self.cluster_bits >= file_len))
            .collect())
    }

    /// Makes the refcount block for the clusters from `s.end` on, at cluster `s.end`.
    fn new_block(&self, cx: &Ctx<'_>, host: &Host, s: &mut State) -> io::Result<()> {
        let per_block = s.refcounts.per_block();
        if (s.end / per_block) as usize >= s.refcounts.table.len() {
            let old = reftable::grow(cx, host, &mut s.refcounts, &mut s.end, &mut s.scratch)?;
            s.free.extend(old);
            if s.refcounts.block_of(s.end).is_some() {
                return Ok(());
            }
        }
        let (c, bi) = (s.end, (s.end / per_block) as usize);
        s.scratch.fill(0);
        s.refcounts.set_in(&mut s.scratch, 0, c % per_block, 1);
        let at = c << self.cluster_bits;
        host.write_durable(cx, &s.scratch, at)?; // the block before the entry that links it
        let entry = at.to_be_bytes();
        // Durable before the clusters it counts are linked.
        host.write_durable(cx, &entry, s.refcounts.table_offset + bi as u64 * 8)?;
        s.refcounts.table[bi] = at;
        s.end = c + 1;
        Ok(())
    }

    /// `n` contiguous clusters at the end of the file (for a new L1 table), refcounted and
    /// synced like a reservation; returns the host offset of the first.
    pub(crate) fn contiguous(&self, cx: &Ctx<'_>, host: &Host, n: u64) -> io::Result<u64> {
        let _serial = self.serial(cx);
        let mut s = self.state();
        let s = &mut *s;
        let per_block = s.refcounts.per_block();
        while (reftable::area_end(&s.refcounts, &s.refcounts.table, s.end, n) - 1) / per_block
            >= s.refcounts.table.len() as u64
        {
            let old = reftable::grow(cx, host, &mut s.refcounts, &mut s.end, &mut s.scratch)?;
            s.free.extend(old);
        }
        let start = s.end;
        let mut table = s.refcounts.table.clone(); // once per new L1 table
        let claimed = reftable::claim(cx, host, &s.refcounts, &mut table, start, n, &mut s.scratch);
        s.refcounts.table = table;
        let (end, new_blocks) = claimed?;
        host.file.flush(cx)?; // the blocks before the table entries that link them
        for b in new_blocks {
            let at = s.refcounts.table_offset + b * 8;
            host.write_u64(cx, s.refcounts.table[b as usize], at)?;
        }
        s.end = end;
        if end << self.cluster_bits > host.file.len() {
            host.file.resize(cx, end << self.cluster_bits)?;
        }
        host.file.flush(cx)?;
        Ok(start << self.cluster_bits)
    }

    /// Drops one reference of each host cluster in `clusters` after the next flush.
    pub(crate) fn free_later(&self, clusters: std::ops::Range<u64>) {
        self.pending().extend(clusters);
    }

    /// The clusters waiting for a flush, taken before the flush (`apply_frees` after it):
    /// frees queued during the flush wait for the next one.
    pub(crate) fn take_pending(&self) -> Vec<u64> {
        std::mem::take(&mut *self.pending())
    }

    /// Drops the references `pending` stands for (their unlinks are durable now). A
    /// cluster whose last reference goes has its host space punched (`PUNCH_HOLE`, the
    /// file's size kept), so that discards through the export give the space back, as
    /// `du` of the image shows; a run of such clusters is one punch. A host file system
    /// that cannot punch only keeps the space.
    pub(crate) fn apply_frees(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        pending: Vec<u64>,
    ) -> io::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let _serial = self.serial(cx);
        let mut s = self.state();
        let s = &mut *s;
        // The run of freed clusters not punched yet: (first, count).
        let mut run: Option<(u64, u64)> = None;
        for &c in &pending {
            let count = s.refcounts.get(cx, host, c)?;
            // Never saturated: QEMU refuses a reference past the largest refcount, so
            // one at the largest (1, with 1-bit refcounts) counts as many references.
            if count == 0 {
                continue; // already free (a damaged image): leave it
            }
            s.refcounts
                .set_run(cx, host, c, 1, count - 1, &mut s.scratch)?;
            if count == 1 {
                if s.free.len() < MAX_FREE {
                    s.free.push(c);
                }
                run = match run {
                    Some((first, n)) if first + n == c => Some((first, n + 1)),
                    other => {
                        if let Some((first, n)) = other {
                            self.punch(cx, host, first, n);
                        }
                        Some((c, 1))
                    }
                };
            }
        }
        if let Some((first, n)) = run {
            self.punch(cx, host, first, n);
        }
        self.recycle(pending);
        Ok(())
    }

    /// Gives the host space of `n` free clusters from `first` back (under the serial
    /// lock: none of them can be handed out meanwhile).
    fn punch(&self, cx: &Ctx<'_>, host: &Host, first: u64, n: u64) {
        let (at, len) = (first << self.cluster_bits, n << self.cluster_bits);
        if let Err(e) = host.file.discard(cx, at, len) {
            log::debug!("punching {len} bytes of freed clusters at {at:#x}: {e}");
        }
    }

    /// Gives a drained pending list's memory back, so that frees between flushes do not
    /// allocate in steady state.
    fn recycle(&self, mut drained: Vec<u64>) {
        drained.clear();
        let mut pending = self.pending();
        if pending.is_empty() && pending.capacity() < drained.capacity() {
            *pending = drained;
        }
    }

    /// What the allocator needs of `refcounts`, a new refcount structure written but not
    /// in force yet (a snapshot made or deleted, `snapshot_edit.rs`): read before the
    /// header switches to it, so that nothing can fail after.
    pub(crate) fn prepare(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        refcounts: Refcounts,
    ) -> io::Result<NewRefcounts> {
        let _serial = self.serial(cx);
        let mut s = self.state();
        let len = host.file.len();
        let (free, end) = scan(cx, host, &refcounts, len, self.cluster_bits, &mut s.scratch)?;
        Ok(NewRefcounts {
            refcounts,
            free,
            end,
        })
    }

    /// Serves from `new` from now on (the header names it now); the reservation must be
    /// empty ([`release`](Self::release)d) and nothing allocated since [`prepare`].
    ///
    /// [`prepare`]: Self::prepare
    pub(crate) fn replace_refcounts(&self, cx: &Ctx<'_>, new: NewRefcounts) {
        let _serial = self.serial(cx);
        let mut s = self.state();
        (s.refcounts, s.free, s.end) = (new.refcounts, new.free, new.end);
    }

    /// Returns the unused reservation (refcount 0 again); for the backend's drop.
    pub(crate) fn release(&self, cx: &Ctx<'_>, host: &Host) -> io::Result<()> {
        let _serial = self.serial(cx);
        let mut s = self.state();
        let s = &mut *s;
        let reserved = std::mem::take(&mut *self.reserved());
        for c in reserved.into_iter().rev() {
            let index = c.at >> self.cluster_bits;
            s.refcounts.set_run(cx, host, index, 1, 0, &mut s.scratch)?;
            s.free.push(index);
        }
        Ok(())
    }
}

/// The free clusters (refcount 0) below the end of the file (`file_len`), lowest last
/// (popped first), and the first cluster past everything that has a refcount (1 at
/// least: cluster 0, the header, is never handed out, whatever its refcount says).
fn scan(
    cx: &Ctx<'_>,
    host: &Host,
    refcounts: &Refcounts,
    file_len: u64,
    cluster_bits: u32,
    scratch: &mut [u8],
) -> io::Result<(Vec<u64>, u64)> {
    let file_clusters = file_len.div_ceil(1 << cluster_bits);
    let (mut free, mut end) = (Vec::new(), file_clusters);
    let per_block = refcounts.per_block();
    for (bi, &block) in refcounts.table.iter().enumerate() {
        if block == 0 {
            continue;
        }
        host.read_exact(cx, scratch, block)?;
        for i in 0..per_block {
            let cluster = bi as u64 * per_block + i;
            match refcounts.get_in(scratch, 0, i) {
                0 if cluster < file_clusters && free.len() < MAX_FREE => free.push(cluster),
                0 => {}
                _ => end = end.max(cluster + 1),
            }
        }
    }
    free.retain(|&c| c != 0);
    free.reverse(); // popped from the back: lowest first
    Ok((free, end.max(1)))
}
