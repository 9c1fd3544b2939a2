//! write_zeroes and discard.
//!
//! Whole clusters become v3 zero clusters (keeping their host cluster, preallocated, when
//! unmapping is not allowed) or, in v2 images without a backing file, unallocated. v2
//! images over a backing file cannot say "zeroes" in an L2 entry, so their clusters are
//! written with zeroes, as are the partial clusters at either end of a request. Clusters
//! that already read as zeroes are left alone. discard is write_zeroes with unmapping:
//! afterwards the range reads as zeroes, never as the backing file.

use std::io;

use crate::range_lock::{Mode, Span};
use crate::{BlockBackend, Ctx};

use super::entry::{self, Mapping, COPIED, ZERO};
use super::write::Source;
use super::Qcow2Backend;

impl Qcow2Backend {
    pub(super) fn zero(
        &self,
        cx: &Ctx<'_>,
        offset: u64,
        len: u64,
        may_unmap: bool,
    ) -> io::Result<()> {
        self.check_writable()?;
        let end = self.grow_to_reach(cx, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let cs = self.cluster_size();
        let (first, last) = (self.cluster_of(offset), self.cluster_of(end - 1) + 1);
        let _held = self.hold(cx, first, last, Mode::Exclusive);
        let mut pos = offset;
        while pos < end {
            let cluster = self.cluster_of(pos);
            let next = ((cluster + 1) * cs).min(end);
            let whole = pos % cs == 0 && (next - pos == cs || next == self.len());
            let m = self.lookup(cx, cluster)?;
            match m {
                _ if self.reads_zero(m) => {}
                _ if whole => self.zero_cluster(cx, cluster, m, may_unmap)?,
                _ => self.write_range_held(cx, cluster, m, pos, next)?,
            }
            pos = next;
        }
        let n = self.h.l2_entries();
        for l1i in first.div_ceil(n)..last / n {
            self.free_emptied(cx, l1i as usize)?;
        }
        Ok(())
    }

    /// Unlinks and frees the L2 table of L1 entry `l1i` if it maps nothing and is the
    /// image's own; the caller holds all its guest clusters exclusively (module docs).
    fn free_emptied(&self, cx: &Ctx<'_>, l1i: usize) -> io::Result<()> {
        let alloc = self.check_writable()?;
        let span = Span {
            start: l1i as u64,
            end: l1i as u64 + 1,
        };
        let _l1 = self.l1_locks.lock(cx, span, Mode::Exclusive);
        let owned = self.l1.get(l1i).filter(|e| e & COPIED != 0);
        let Some(table) = owned.and_then(entry::l2_table) else {
            return Ok(());
        };
        let unmapped = |e: u64| e == 0 || (e == ZERO && self.backing.is_none());
        for l2i in 0..self.h.l2_entries() as usize {
            if !unmapped(self.l2.get(cx, &self.host, table, l2i)?) {
                return Ok(());
            }
        }
        let offset = self.l1.read().offset;
        self.host.write_u64(cx, 0, offset + l1i as u64 * 8)?;
        self.l1.read().entries[l1i].store(0, std::sync::atomic::Ordering::Release);
        self.l2.forget(table);
        let c = table >> self.h.cluster_bits;
        alloc.free_later(c..c + 1);
        Ok(())
    }

    /// Whether a cluster mapped as `m` reads as zeroes.
    pub(super) fn reads_zero(&self, m: Mapping) -> bool {
        match m {
            Mapping::Zero { .. } => true,
            Mapping::Unallocated => self.backing.is_none(),
            _ => false,
        }
    }

    /// Writes zeroes over `[pos, next)` of `cluster` (held exclusively).
    fn write_range_held(
        &self,
        cx: &Ctx<'_>,
        cluster: u64,
        m: Mapping,
        pos: u64,
        next: u64,
    ) -> io::Result<()> {
        let cs = self.cluster_size();
        match m {
            Mapping::Data { host, copied: true } => {
                self.write_at(cx, Source::Zeroes, next - pos, host + pos % cs)
            }
            _ => self.rewrite_cluster(cx, cluster, m, Source::Zeroes, pos % cs, next - pos),
        }
    }

    /// Makes all of `cluster` (held exclusively) read as zeroes.
    fn zero_cluster(
        &self,
        cx: &Ctx<'_>,
        cluster: u64,
        m: Mapping,
        may_unmap: bool,
    ) -> io::Result<()> {
        let alloc = self.check_writable()?;
        let cs = self.cluster_size();
        let value = match (self.h.version, m) {
            (3, Mapping::Data { host, copied: true }) if !may_unmap => host | COPIED | ZERO,
            (3, _) => ZERO,
            (_, _) if may_unmap && self.backing.is_none() => 0,
            (_, Mapping::Data { host, copied: true }) => {
                return self.write_at(cx, Source::Zeroes, cs, host)
            }
            _ => return self.rewrite_cluster(cx, cluster, m, Source::Zeroes, 0, cs),
        };
        let (table, l2i) = self.l2_table_for(cx, cluster)?;
        self.set_l2(cx, table, l2i, value)?;
        if value & COPIED == 0 {
            alloc.free_later(m.host_clusters(self.h.cluster_bits));
        }
        Ok(())
    }
}
