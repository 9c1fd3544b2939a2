//! The write path. A request first holds its guest clusters shared and, if every one is a
//! data cluster with refcount 1, writes in place (runs back to back in the file in one
//! transfer). Otherwise it holds them exclusively and rewrites each cluster that needs it
//! into a new one: the cluster as it reads now (backing file, zeroes, decompressed or
//! shared data) with the new bytes over it, written whole, then linked in the L2 table;
//! the old host clusters are freed after the next flush (`alloc.rs`). Whole clusters that
//! hold no host cluster yet (unallocated, or zero without a preallocation), one after
//! another in one L2 table, get host clusters that follow each other in the file: one data
//! write and one write of their L2 entries for the run (a 1 MiB write is 16 clusters of 64
//! KiB), where a cluster at a time took 16 of each.
//!
//! Order on disk for a new cluster: its refcount (reserved, durable), its data, its L2
//! entry. Where the new cluster holds bytes the write does not cover (a partial write
//! into a cluster with a backing file, a snapshot's or compressed data, or a reused
//! cluster), its L2 entry waits for the next flush, which syncs the data first
//! (`deferred.rs`): else a power loss could keep the entry and lose those bytes. A write
//! covering the whole cluster, or one into a fresh cluster of a disk that reads zeroes
//! there, needs no such wait: the bytes at stake are the write's own, not yet flushed.
//! For a new L2 table: its refcount, its contents (zeroes, or a copy of the table
//! snapshots share) written with `RWF_DSYNC`, its L1 entry.
//!
//! Internal snapshots share L2 tables and data clusters with the active state (refcount
//! above one; the L1 or L2 entry lacks [`COPIED`]). A write never changes a shared
//! cluster: a shared data cluster is rewritten into a new one like any other that cannot
//! be written in place, and a shared L2 table is copied before its first entry changes
//! ([`Qcow2Backend::l2_table_for`]), as QEMU's qcow2 driver does; the old one loses the
//! active state's reference after the next flush.

use std::io::{self, IoSlice};
use std::sync::atomic::Ordering;

use crate::range_lock::{Mode, Span};
use crate::{iov, Ctx};

use super::entry::{self, Mapping, COPIED};
use super::Qcow2Backend;

/// Most guest clusters that one allocating write gives new host clusters together (one
/// data write, one L2 write).
const MAX_RUN: usize = 64;

/// Zeroes to write from, a piece at a time.
pub(super) static ZEROES: [u8; 64 << 10] = [0; 64 << 10];

/// The new bytes of a write: the caller's iovecs from a logical byte on, or zeroes.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    Bufs(&'a [IoSlice<'a>], usize),
    Zeroes,
}

impl Source<'_> {
    /// The source advanced by `n` bytes.
    fn skip(self, n: usize) -> Self {
        match self {
            Source::Bufs(b, skip) => Source::Bufs(b, skip + n),
            Source::Zeroes => Source::Zeroes,
        }
    }

    /// Copies the next `dst.len()` bytes into `dst`.
    fn copy_to(self, dst: &mut [u8]) {
        match self {
            Source::Bufs(b, skip) => iov::gather(b, skip, dst),
            Source::Zeroes => dst.fill(0),
        }
    }
}

impl Qcow2Backend {
    pub(super) fn write(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.check_writable()?;
        let len = iov::total(bufs) as u64;
        let end = self.grow_to_reach(cx, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.write_range(cx, Source::Bufs(bufs, 0), offset, end)
    }

    /// Writes `[offset, end)` from `src`, holding the clusters as the module docs say.
    pub(super) fn write_range(
        &self,
        cx: &Ctx<'_>,
        src: Source<'_>,
        offset: u64,
        end: u64,
    ) -> io::Result<()> {
        let (first, last) = (self.cluster_of(offset), self.cluster_of(end - 1) + 1);
        {
            let _held = self.hold(cx, first, last, Mode::Shared);
            if self.all_in_place(cx, first, last)? {
                return self.write_in_place(cx, src, offset, end);
            }
        }
        let _held = self.hold(cx, first, last, Mode::Exclusive);
        let cs = self.cluster_size();
        let mut pos = offset;
        while pos < end {
            let cluster = self.cluster_of(pos);
            let next = ((cluster + 1) * cs).min(end);
            let piece = src.skip((pos - offset) as usize);
            match self.lookup(cx, cluster)? {
                Mapping::Data { copied: true, .. } => self.write_in_place(cx, piece, pos, next)?,
                old if pos % cs == 0
                    && end - pos >= 2 * cs
                    && old.host_clusters(self.h.cluster_bits).is_empty() =>
                {
                    pos += self.allocate_run(cx, cluster, piece, end - pos)?;
                    continue;
                }
                old => self.rewrite_cluster(cx, cluster, old, piece, pos % cs, next - pos)?,
            }
            pos = next;
        }
        Ok(())
    }

    /// Gives guest clusters from `cluster` on (held exclusively; the first holds no host
    /// cluster) new host clusters that follow each other in the file, filled from `src`:
    /// as many whole clusters of the `len` bytes as hold no host cluster either, lie in the
    /// same L2 table and come contiguous from the allocator (at most [`MAX_RUN`]), with one
    /// data write and one write of their L2 entries. Returns the bytes written, a cluster
    /// at least. The order on disk is a single cluster's: refcounts (reserved, durable),
    /// data, L2 entries; nothing to free.
    fn allocate_run(
        &self,
        cx: &Ctx<'_>,
        cluster: u64,
        src: Source<'_>,
        len: u64,
    ) -> io::Result<u64> {
        let alloc = self.check_writable()?;
        let cs = self.cluster_size();
        let (table, l2i) = self.l2_table_for(cx, cluster)?;
        let room = self.h.l2_entries() - l2i as u64;
        let mut want = (len / cs).min(room).min(MAX_RUN as u64);
        for j in 1..want {
            let old = self.lookup(cx, cluster + j)?;
            if !old.host_clusters(self.h.cluster_bits).is_empty() {
                want = j;
                break;
            }
        }
        let (first, n) = alloc.run(cx, &self.host, want)?;
        self.write_at(cx, src, n * cs, first)?;
        let mut raw = [0u8; 8 * MAX_RUN];
        let entry = |j: u64| Mapping::data_entry(first + j * cs);
        for (j, e) in raw.chunks_exact_mut(8).take(n as usize).enumerate() {
            e.copy_from_slice(&entry(j as u64).to_be_bytes());
        }
        if (0..n).any(|j| self.l2.is_deferred(table, l2i + j as usize)) {
            for j in 0..n {
                self.defer_l2(cx, table, l2i + j as usize, entry(j))?;
            }
            return Ok(n * cs);
        }
        self.host
            .write(cx, &raw[..8 * n as usize], table + l2i as u64 * 8)?;
        for j in 0..n {
            self.l2.set(table, l2i + j as usize, entry(j));
        }
        Ok(n * cs)
    }

    /// Whether every cluster of `[first, last)` is data with refcount 1.
    fn all_in_place(&self, cx: &Ctx<'_>, first: u64, last: u64) -> io::Result<bool> {
        for c in first..last {
            if !matches!(self.lookup(cx, c)?, Mapping::Data { copied: true, .. }) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes `[offset, end)` into clusters that are data with refcount 1 (held).
    fn write_in_place(
        &self,
        cx: &Ctx<'_>,
        src: Source<'_>,
        offset: u64,
        end: u64,
    ) -> io::Result<()> {
        let cs = self.cluster_size();
        let mut pos = offset;
        while pos < end {
            let Mapping::Data { host, .. } = self.lookup(cx, self.cluster_of(pos))? else {
                unreachable!("held clusters changed mapping");
            };
            if host < cs {
                // A damaged L2 entry: writing there would overwrite the header.
                let path = self.path.display();
                log::error!("qcow2 {path}: a data cluster at offset 0 (the image is corrupt)");
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            // Extend over clusters that follow in the file too.
            let mut run = (cs - pos % cs).min(end - pos);
            while pos + run < end {
                match self.lookup(cx, self.cluster_of(pos + run))? {
                    Mapping::Data { host: h, .. } if h == host + pos % cs + run => {}
                    _ => break,
                }
                run = (run + cs).min(end - pos);
            }
            self.write_at(cx, src.skip((pos - offset) as usize), run, host + pos % cs)?;
            pos += run;
        }
        Ok(())
    }

    /// Writes `len` bytes of `src` at host offset `at`.
    pub(super) fn write_at(
        &self,
        cx: &Ctx<'_>,
        src: Source<'_>,
        len: u64,
        at: u64,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = match src {
                Source::Bufs(bufs, skip) => {
                    let mut window = iov::empty_window();
                    let (used, covered) = iov::window(
                        bufs,
                        skip + done as usize,
                        (len - done) as usize,
                        &mut window,
                    );
                    self.host.file.writev(cx, &window[..used], at + done)?;
                    covered as u64
                }
                Source::Zeroes => {
                    let n = (len - done).min(ZEROES.len() as u64);
                    self.host.write(cx, &ZEROES[..n as usize], at + done)?;
                    n
                }
            };
            done += n;
        }
        Ok(())
    }

    /// Gives guest `cluster` (mapped as `old`, held exclusively) a new host cluster holding
    /// what it reads as now with `len` bytes of `src` at `within`.
    pub(super) fn rewrite_cluster(
        &self,
        cx: &Ctx<'_>,
        cluster: u64,
        old: Mapping,
        src: Source<'_>,
        within: u64,
        len: u64,
    ) -> io::Result<()> {
        let alloc = self.check_writable()?;
        let (table, l2i) = self.l2_table_for(cx, cluster)?;
        let new = alloc.cluster(cx, &self.host)?;
        let cs = self.cluster_size();
        let entry = Mapping::data_entry(new.at);
        if len == cs {
            self.write_at(cx, src, cs, new.at)?;
            self.set_l2(cx, table, l2i, entry)?;
        } else if new.zeroed && self.reads_zero(old) {
            // The rest reads as zeroes already: write only the new bytes.
            if !matches!(src, Source::Zeroes) {
                self.write_at(cx, src, len, new.at + within)?;
            }
            self.set_l2(cx, table, l2i, entry)?;
        } else {
            let mut buf = self.bufs.take();
            self.read_cluster(cx, cluster, old, &mut buf)?;
            src.copy_to(&mut buf[within as usize..(within + len) as usize]);
            self.host.write(cx, &buf, new.at)?;
            // Linked on disk only after the data is: the bytes this write does not cover
            // (copied from the backing file, a shared or compressed cluster, or zeroes
            // over a reused cluster) must never be lost to a power loss that keeps the
            // entry. (Found by the crash-state checker: the entry could land alone, and
            // those bytes read as zeroes.)
            self.defer_l2(cx, table, l2i, entry)?;
        }
        alloc.free_later(old.host_clusters(self.h.cluster_bits));
        Ok(())
    }

    /// Writes L2 entry `l2i` of the table at `table`, then updates the cache; or defers
    /// it if the entry is deferred already (`deferred.rs`). The caller holds the guest
    /// cluster exclusively, so no other request defers it meanwhile.
    pub(super) fn set_l2(
        &self,
        cx: &Ctx<'_>,
        table: u64,
        l2i: usize,
        value: u64,
    ) -> io::Result<()> {
        if self.l2.is_deferred(table, l2i) {
            return self.defer_l2(cx, table, l2i, value);
        }
        self.host.write_u64(cx, value, table + l2i as u64 * 8)?;
        self.l2.set(table, l2i, value);
        Ok(())
    }

    /// The L2 table of guest `cluster` and the entry's index in it, this image's own: made
    /// if missing, copied first if a snapshot shares it (its L1 entry lacks [`COPIED`]).
    pub(super) fn l2_table_for(&self, cx: &Ctx<'_>, cluster: u64) -> io::Result<(u64, usize)> {
        let (l1i, l2i) = self.split(cluster);
        let owned = || {
            self.l1
                .get(l1i)
                .filter(|e| e & COPIED != 0)
                .and_then(entry::l2_table)
        };
        if let Some(table) = owned() {
            return Ok((table, l2i));
        }
        let span = Span {
            start: l1i as u64,
            end: l1i as u64 + 1,
        };
        let _l1 = self.l1_locks.lock(cx, span, Mode::Exclusive);
        if let Some(table) = owned() {
            return Ok((table, l2i)); // made or copied meanwhile
        }
        let shared = self.l1.get(l1i).and_then(entry::l2_table);
        let alloc = self.check_writable()?;
        let new = alloc.cluster(cx, &self.host)?;
        let table = new.at;
        match shared {
            Some(old) => self.copy_l2_table(cx, old, table)?,
            None if !new.zeroed => {
                let mut buf = self.bufs.take();
                buf.fill(0);
                // The table's contents before the entry that links it.
                self.host.write_durable(cx, &buf, table)?;
            }
            None => {}
        }
        let value = table | COPIED;
        // The L1 table stays put meanwhile: moving it takes every L1 entry's lock.
        let offset = self.l1.read().offset;
        self.host.write_u64(cx, value, offset + l1i as u64 * 8)?;
        self.l1.read().entries[l1i].store(value, Ordering::Release);
        if let Some(old) = shared {
            self.l2.forget(old);
            // The snapshots keep it: its refcount drops by the active state's reference.
            let c = old >> self.h.cluster_bits;
            alloc.free_later(c..c + 1);
        }
        Ok((table, l2i))
    }

    /// Copies the L2 table at `old`, which snapshots share, to the new cluster `new`,
    /// durable before anything links it. The data clusters it maps keep their refcounts:
    /// each counts the active state's reference already, whichever table carries it.
    fn copy_l2_table(&self, cx: &Ctx<'_>, old: u64, new: u64) -> io::Result<()> {
        let mut buf = self.bufs.take();
        self.host.read_exact(cx, &mut buf, old)?;
        self.host.write_durable(cx, &buf, new)
    }
}
