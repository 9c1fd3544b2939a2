//! Requests that the server's minimum block does not divide, made whole blocks, as QEMU's
//! block layer makes them for an NBD export whose minimum block is more than a byte (a
//! server over storage it will not read-modify-write itself: nbdkit's blocksize-policy
//! filter says so, nbd-server and others can; qemu-nbd 10 states 1, doing it itself). The
//! server refuses such requests with `EINVAL`, and the FUSE export passes a user's
//! unaligned `pread` or `pwrite` through as it is (`FOPEN_DIRECT_IO`), so `head -c 100`
//! on the mounted file would fail without this.
//!
//! - A read reads the blocks that cover it into a pooled bounce buffer, in chunks of one
//!   buffer, and copies out the bytes asked for.
//! - A write is a read-modify-write: the partial blocks at either end are read, the caller's
//!   bytes copied over them, and the covering blocks written. It holds those blocks
//!   **exclusively** ([`RangeLocks`]), and every other write, zeroing or discard holds its
//!   blocks **shared**: no write can land between the read and the write-back, which
//!   would put old bytes back over it. Reads take nothing (a write-back writes exactly the
//!   bytes a read would see).
//! - Zeroing or discarding a range writes zeroes into its partial blocks (a
//!   read-modify-write each) and sends one command for the whole blocks inside.
//!
//! Aligned requests (all of them, with well-behaved clients) only pay a shared span for
//! writes; with a minimum block of 1 there is no [`Align`] at all.
//!
//! [`RangeLocks`]: crate::range_lock::RangeLocks

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::iov;
use crate::pool::BouncePool;
use crate::range_lock::{Mode, RangeGuard, RangeLocks, Span};
use crate::Ctx;

/// Bytes per bounce buffer: a multiple of every minimum block (at most 64 KiB, a power of
/// two, by the protocol).
const BOUNCE_LEN: usize = 256 << 10;
/// Bounce buffers kept idle for reuse.
const MAX_IDLE: usize = 8;
/// The largest minimum block the protocol allows, and so the largest partial block.
const MAX_MIN_BLOCK: usize = 64 << 10;
/// Source of the zeroes written into partial blocks.
static ZEROES: [u8; MAX_MIN_BLOCK] = [0; MAX_MIN_BLOCK];

/// Whole blocks at `at` of the export, read into or written from a buffer: the backend's
/// aligned path.
pub(super) trait Blocks {
    /// Reads `buf.len()` bytes (whole blocks) at `at`.
    fn read_blocks(&self, cx: &Ctx<'_>, buf: &mut [u8], at: u64) -> io::Result<()>;
    /// Writes `buf` (whole blocks) at `at`.
    fn write_blocks(&self, cx: &Ctx<'_>, buf: &[u8], at: u64) -> io::Result<()>;
}

/// Alignment to a minimum block of more than one byte, and what it needs.
pub(super) struct Align {
    min: u64,
    pool: BouncePool,
    ranges: RangeLocks,
    bounced_reads: AtomicU64,
    rmw_writes: AtomicU64,
}

impl Align {
    /// For a server whose minimum block is `min` (> 1). The export's size is a multiple of
    /// it (the handshake leaves out a tail that is not), so the blocks around a request
    /// inside the export are inside it too.
    pub(super) fn new(min: u32) -> Align {
        let min = u64::from(min);
        debug_assert!(min > 1 && min as usize <= MAX_MIN_BLOCK && min.is_power_of_two());
        Align {
            min,
            pool: BouncePool::new(BOUNCE_LEN, 4096, MAX_IDLE),
            ranges: RangeLocks::default(),
            bounced_reads: AtomicU64::new(0),
            rmw_writes: AtomicU64::new(0),
        }
    }

    /// Whether `[offset, offset + len)` is whole blocks.
    pub(super) fn aligned(&self, offset: u64, len: u64) -> bool {
        offset % self.min == 0 && len % self.min == 0
    }

    /// Whether the aligned path can send `bufs` as whole-block commands: a command takes
    /// at most [`iov::WINDOW`] iovecs, so with more, each iovec must be whole blocks.
    pub(super) fn fits<B: std::ops::Deref<Target = [u8]>>(&self, bufs: &[B]) -> bool {
        bufs.len() <= iov::WINDOW || bufs.iter().all(|b| b.len() as u64 % self.min == 0)
    }

    /// The blocks covering `[offset, end)`.
    fn span(&self, offset: u64, end: u64) -> Span {
        Span {
            start: offset / self.min * self.min,
            end: end.div_ceil(self.min).saturating_mul(self.min),
        }
    }

    /// Holds the blocks of an aligned modification of `[offset, end)` shared, against a
    /// read-modify-write over them.
    pub(super) fn shared(&self, cx: &Ctx<'_>, offset: u64, end: u64) -> RangeGuard<'_> {
        self.ranges.lock(cx, self.span(offset, end), Mode::Shared)
    }

    /// Reads `n` bytes at `offset` into `bufs` through the blocks that cover them.
    pub(super) fn read(
        &self,
        cx: &Ctx<'_>,
        io: &dyn Blocks,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
        n: u64,
    ) -> io::Result<()> {
        self.bounced_reads.fetch_add(1, Ordering::Relaxed);
        let want_end = offset + n;
        let Span { start, end } = self.span(offset, want_end);
        let mut bounce = self.pool.take();
        let mut at = start;
        while at < end {
            let len = (end - at).min(bounce.len() as u64) as usize;
            io.read_blocks(cx, &mut bounce[..len], at)?;
            let (lo, hi) = (at.max(offset), (at + len as u64).min(want_end));
            let from = &bounce[(lo - at) as usize..(hi - at) as usize];
            iov::scatter(bufs, (lo - offset) as usize, from);
            at += len as u64;
        }
        Ok(())
    }

    /// Writes `bufs` at `offset` as a read-modify-write of the blocks that cover them,
    /// holding those blocks exclusively.
    pub(super) fn write(
        &self,
        cx: &Ctx<'_>,
        io: &dyn Blocks,
        bufs: &[IoSlice<'_>],
        offset: u64,
    ) -> io::Result<()> {
        self.rmw_writes.fetch_add(1, Ordering::Relaxed);
        let want_end = offset + iov::total(bufs) as u64;
        let span = self.span(offset, want_end);
        let _blocks = self.ranges.lock(cx, span, Mode::Exclusive);
        let mut bounce = self.pool.take();
        let mut at = span.start;
        while at < span.end {
            let len = (span.end - at).min(bounce.len() as u64) as usize;
            let chunk = &mut bounce[..len];
            let chunk_end = at + len as u64;
            // The old bytes of the blocks the caller's do not cover whole: the first and
            // the last (read once if they are the same block).
            let mut head_end = at;
            if offset > at {
                head_end = (at + self.min).min(chunk_end);
                io.read_blocks(cx, &mut chunk[..(head_end - at) as usize], at)?;
            }
            if want_end < chunk_end {
                let tail = (want_end / self.min * self.min).max(head_end);
                if tail < chunk_end {
                    io.read_blocks(cx, &mut chunk[(tail - at) as usize..], tail)?;
                }
            }
            let (lo, hi) = (at.max(offset), chunk_end.min(want_end));
            let into = &mut chunk[(lo - at) as usize..(hi - at) as usize];
            iov::gather(bufs, (lo - offset) as usize, into);
            io.write_blocks(cx, chunk, at)?;
            at = chunk_end;
        }
        Ok(())
    }

    /// Zeroes `[offset, end)`: the partial blocks at either end by read-modify-write; the
    /// whole blocks inside are returned for one command (empty if there are none).
    pub(super) fn zero_edges(
        &self,
        cx: &Ctx<'_>,
        io: &dyn Blocks,
        offset: u64,
        end: u64,
    ) -> io::Result<(u64, u64)> {
        let inner_start = offset.div_ceil(self.min) * self.min;
        let inner_end = end / self.min * self.min;
        if inner_start >= inner_end {
            self.zero_partial(cx, io, offset, end)?; // within one block, or two halves
            return Ok((0, 0));
        }
        if offset < inner_start {
            self.zero_partial(cx, io, offset, inner_start)?;
        }
        if inner_end < end {
            self.zero_partial(cx, io, inner_end, end)?;
        }
        Ok((inner_start, inner_end))
    }

    /// Writes zeroes over `[offset, end)`, less than two blocks, by read-modify-write.
    fn zero_partial(&self, cx: &Ctx<'_>, io: &dyn Blocks, offset: u64, end: u64) -> io::Result<()> {
        let mut at = offset;
        while at < end {
            let n = (end - at).min(MAX_MIN_BLOCK as u64) as usize;
            self.write(cx, io, &[IoSlice::new(&ZEROES[..n])], at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Reads that went through a bounce buffer.
    pub(super) fn bounced_reads(&self) -> u64 {
        self.bounced_reads.load(Ordering::Relaxed)
    }

    /// Writes (and partial zeroings) done as read-modify-write.
    pub(super) fn rmw_writes(&self) -> u64 {
        self.rmw_writes.load(Ordering::Relaxed)
    }

    /// Bounce buffers allocated (stops growing in steady state).
    pub(super) fn buffers_allocated(&self) -> u64 {
        self.pool.allocated()
    }

    /// Times a request waited for blocks another held.
    pub(super) fn waits(&self) -> u64 {
        self.ranges.waits()
    }
}
