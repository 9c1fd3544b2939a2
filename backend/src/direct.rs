//! O_DIRECT support for the file backend: the alignment rules, and the bounce path for
//! requests that break them.
//!
//! With O_DIRECT the kernel wants the file offset, every iovec's length and every iovec's
//! address aligned (`EINVAL` otherwise). The rules come from `statx(STATX_DIOALIGN)` (Linux
//! 6.1); where it reports nothing (tmpfs here, older kernels) we assume 4096 for both,
//! which covers 512- and 4096-byte devices.
//!
//! A request that fits goes to the kernel with the caller's buffers (the FUSE transports put
//! WRITE data and READ replies on a page boundary, so aligned requests always fit). Any
//! other goes through a pooled bounce buffer ([`BouncePool`]) over the span that covers
//! it, in chunks of one buffer:
//! - reads read the span and copy out the requested bytes;
//! - a write whose offset and length are aligned, but whose memory is not, is copied into
//!   the bounce buffer and written: its span is its own bytes, and nothing is read;
//! - any other write is a read-modify-write ([`Direct::is_rmw`]): the partial blocks at
//!   either end are read, the caller's bytes copied in, and the span written. The caller
//!   must hold the span exclusively (`range_lock`), or a write landing in one of those
//!   blocks meanwhile would be undone. A padded write past the end of the file grows it to
//!   the padded end; the caller passes the size to keep and the file is truncated back to it.
//!
//! RMW arithmetic uses `unit = max(memory, offset)` alignment, so every block boundary
//! inside a bounce buffer is also a valid buffer address.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::ops::Deref;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pool::BouncePool;
use crate::range_lock::Span;
use crate::sys::{self, IOV_MAX};
use crate::{iov, Ctx};

/// Alignment assumed when statx does not report one.
const FALLBACK_ALIGN: usize = 4096;
/// Bytes per bounce buffer (rounded up to the alignment unit).
const BOUNCE_LEN: usize = 256 * 1024;
/// Bounce buffers kept idle for reuse.
const MAX_IDLE_BOUNCE: usize = 8;

/// O_DIRECT state of one open image.
pub(crate) struct Direct {
    /// Required buffer address alignment.
    pub(crate) mem: usize,
    /// Required file offset and length alignment.
    pub(crate) off: usize,
    /// Whether `mem` and `off` came from statx (else [`FALLBACK_ALIGN`]).
    pub(crate) reported: bool,
    pub(crate) pool: BouncePool,
    /// Transfers that went through a bounce buffer: reads, writes bounced for memory
    /// alignment only, read-modify-writes.
    pub(crate) bounced_reads: AtomicU64,
    pub(crate) bounced_writes: AtomicU64,
    pub(crate) rmw_writes: AtomicU64,
}

impl Direct {
    /// Probes the alignment of an fd opened with O_DIRECT.
    pub(crate) fn probe(file: &File) -> Direct {
        let found = sys::dio_align(file.as_fd()).ok().flatten();
        let (mem, off) = found.map_or((FALLBACK_ALIGN, FALLBACK_ALIGN), |(m, o)| {
            (m as usize, o as usize)
        });
        let unit = mem.max(off);
        let pool = BouncePool::new(BOUNCE_LEN.next_multiple_of(unit), unit, MAX_IDLE_BOUNCE);
        Direct {
            mem,
            off,
            reported: found.is_some(),
            pool,
            bounced_reads: AtomicU64::new(0),
            bounced_writes: AtomicU64::new(0),
            rmw_writes: AtomicU64::new(0),
        }
    }

    fn unit(&self) -> u64 {
        self.mem.max(self.off) as u64
    }

    /// Whether a write of `[pos, end)` must read-modify-write: it starts or ends inside a
    /// logical block.
    pub(crate) fn is_rmw(&self, pos: u64, end: u64) -> bool {
        let off = self.off as u64;
        pos % off != 0 || end % off != 0
    }

    /// The start of the RMW block (`unit`) that holds byte `pos`.
    pub(crate) fn block_start(&self, pos: u64) -> u64 {
        pos / self.unit() * self.unit()
    }

    /// The blocks a transfer of `[pos, end)` moves: its own bytes when they are aligned,
    /// else the `unit`-aligned span that covers them.
    pub(crate) fn span(&self, pos: u64, end: u64) -> Span {
        if !self.is_rmw(pos, end) {
            return Span { start: pos, end };
        }
        Span {
            start: self.block_start(pos),
            end: end.next_multiple_of(self.unit()),
        }
    }

    /// Whether a transfer at `pos` from/to the iovecs at logical byte `skip` of `bufs` can
    /// go to the kernel as it is: checks exactly what the next syscall will see.
    pub(crate) fn fits<B: Deref<Target = [u8]>>(&self, bufs: &[B], skip: usize, pos: u64) -> bool {
        let (idx, within) = iov::locate(bufs, skip);
        let ok = |s: &[u8]| s.as_ptr() as usize % self.mem == 0 && s.len() % self.off == 0;
        if pos % self.off as u64 != 0 {
            return false;
        }
        if within > 0 {
            return ok(&bufs[idx][within..]);
        }
        bufs[idx..].iter().take(IOV_MAX).all(|b| ok(b))
    }

    /// Reads `bufs` from logical byte `skip` on, at file offset `pos`, through a bounce
    /// buffer. Returns the bytes copied out: all of them unless the file ends first.
    pub(crate) fn read(
        &self,
        cx: &Ctx<'_>,
        file: &File,
        bufs: &mut [IoSliceMut<'_>],
        skip: usize,
        pos: u64,
    ) -> io::Result<usize> {
        let want_end = pos + (iov::total(bufs) - skip) as u64;
        let Span { start, end } = self.span(pos, want_end);
        self.bounced_reads.fetch_add(1, Ordering::Relaxed);
        let mut bounce = self.pool.take();
        let (mut at, mut done) = (start, 0);
        while at < end {
            let n = (end - at).min(bounce.len() as u64) as usize;
            let got = self.read_full(cx, file, &mut bounce[..n], at)?;
            let (lo, hi) = (at.max(pos), (at + got as u64).min(want_end));
            if hi > lo {
                iov::scatter(
                    bufs,
                    skip + (lo - pos) as usize,
                    &bounce[(lo - at) as usize..(hi - at) as usize],
                );
                done += (hi - lo) as usize;
            }
            if got < n {
                break;
            }
            at += n as u64;
        }
        Ok(done)
    }

    /// Writes `bufs` from logical byte `skip` on, at file offset `pos`, through a bounce
    /// buffer; then truncates the file back to `keep` bytes if the padding grew it past
    /// that. For a read-modify-write the caller holds the span exclusively, and the size
    /// lock if the span ends past `keep`. Returns the bytes written (all of them).
    pub(crate) fn write(
        &self,
        cx: &Ctx<'_>,
        file: &File,
        bufs: &[IoSlice<'_>],
        skip: usize,
        pos: u64,
        keep: u64,
    ) -> io::Result<usize> {
        let want = iov::total(bufs) - skip;
        let end = self.span(pos, pos + want as u64).end;
        let counter = match self.is_rmw(pos, pos + want as u64) {
            true => &self.rmw_writes,
            false => &self.bounced_writes,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let written = self.write_span(cx, file, bufs, skip, pos);
        let trimmed = if end > keep {
            cx.ftruncate(file, keep)
        } else {
            Ok(())
        };
        written.and(trimmed).map(|()| want)
    }

    /// The chunk loop of [`Direct::write`].
    fn write_span(
        &self,
        cx: &Ctx<'_>,
        file: &File,
        bufs: &[IoSlice<'_>],
        skip: usize,
        pos: u64,
    ) -> io::Result<()> {
        let want_end = pos + (iov::total(bufs) - skip) as u64;
        let Span { start, end } = self.span(pos, want_end);
        let mut bounce = self.pool.take();
        let mut at = start;
        while at < end {
            let n = (end - at).min(bounce.len() as u64) as usize;
            let chunk = &mut bounce[..n];
            self.read_edges(cx, file, chunk, at, pos, want_end)?;
            let (lo, hi) = (at.max(pos), (at + n as u64).min(want_end));
            iov::gather(
                bufs,
                skip + (lo - pos) as usize,
                &mut chunk[(lo - at) as usize..(hi - at) as usize],
            );
            self.write_full(cx, file, chunk, at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Loads the blocks of `chunk` (at file offset `at`) that the data `[pos, want_end)`
    /// covers only partly: the first if the data starts after it, the last if the data ends
    /// before it.
    fn read_edges(
        &self,
        cx: &Ctx<'_>,
        file: &File,
        chunk: &mut [u8],
        at: u64,
        pos: u64,
        want_end: u64,
    ) -> io::Result<()> {
        let (n, unit) = (chunk.len(), self.unit() as usize);
        let head = at < pos;
        if head {
            self.read_block(cx, file, &mut chunk[..unit], at)?;
        }
        if at + n as u64 > want_end && !(head && n == unit) {
            self.read_block(cx, file, &mut chunk[n - unit..], at + (n - unit) as u64)?;
        }
        Ok(())
    }

    /// Reads one block; what lies past the end of the file reads as zeroes.
    fn read_block(&self, cx: &Ctx<'_>, file: &File, block: &mut [u8], at: u64) -> io::Result<()> {
        let got = self.read_full(cx, file, block, at)?;
        block[got..].fill(0);
        Ok(())
    }

    /// Reads aligned `buf` at aligned `at` until full or end of file. A short read that ends
    /// off the alignment can only be the end of the file, and retrying there would fail.
    fn read_full(&self, cx: &Ctx<'_>, file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = cx.readv_at(
                file,
                &mut [IoSliceMut::new(&mut buf[done..])],
                at + done as u64,
            )?;
            done += n;
            if n == 0 || done % self.off != 0 {
                break;
            }
        }
        Ok(done)
    }

    /// Writes all of aligned `buf` at aligned `at`.
    fn write_full(&self, cx: &Ctx<'_>, file: &File, buf: &[u8], at: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match cx.writev_at(file, &[IoSlice::new(&buf[done..])], at + done as u64)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => done += n,
            }
        }
        Ok(())
    }
}
