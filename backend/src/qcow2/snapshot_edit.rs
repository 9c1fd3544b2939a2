//! Making and deleting internal snapshots while the image serves (QMP
//! `blockdev-snapshot-internal-sync` and `blockdev-snapshot-delete-internal-sync`), in the
//! order of QEMU's block/qcow2-snapshot.c (`qcow2_snapshot_create`, `qcow2_snapshot_delete`)
//! and block/qcow2-refcount.c (`qcow2_update_snapshot_refcount`).
//!
//! Each holds every guest cluster and every L1 entry exclusively for its whole run
//! (requests wait, then go on) and flushes first, so that the tables on disk are the
//! whole truth: no L2 entry deferred, no free pending. Each step below ends with a sync.
//!
//! # Create
//! 1. The active L1 table copied to new clusters (without COPIED bits: they mean nothing
//!    in a snapshot's table); the COPIED bit cleared in the active L1 and L2 entries, and
//!    the L2 cache drops the tables rewritten, so the next write to any of them copies
//!    first (`write.rs`). QEMU orders these before the refcounts too (its refcount blocks
//!    depend on its L2 tables when it adds references).
//! 2. Refcount +1 for every L2 table and data cluster the active L1 reaches (refused
//!    before step 1 if one would pass the largest refcount, `ERANGE`); the new snapshot
//!    table (the old entries as they are, the new one last) written to new clusters.
//! 3. The header: `nb_snapshots` and `snapshots_offset` in one 12-byte write (bytes 60-71,
//!    one sector). The snapshot exists from here.
//! 4. The old table's clusters freed.
//!
//! A crash before 3 leaves no snapshot and leaked clusters; between 1 and 2, also active
//! entries without COPIED whose cluster has refcount 1 (a needless copy at the next write:
//! QEMU's order leaves the same, `qemu-img check` reports it as "ERROR OFLAG_COPIED", and
//! both the next writable open of a v3 image, which is dirty then, and `qemu-img check
//! -r all` set the bit again). No order avoids a window there: the bit and the count live
//! in different clusters, and COPIED on a cluster whose count says two would be worse.
//!
//! # Delete
//! 1. The table without the entry written to new clusters (none if it was the last: offset
//!    0, as QEMU writes it); the header switched as above; the old table freed.
//! 2. Refcount -1 for the snapshot's L1 table and for every L2 table and data cluster its
//!    L1 reaches; those left with none are free (reused, and their space punched).
//! 3. COPIED set back on the active L1 and L2 entries whose cluster's refcount is now 1, as
//!    QEMU does (`qcow2_update_snapshot_refcount` with addend 0); the L2 cache drops the
//!    tables rewritten.
//!
//! A crash after 1 leaks what the snapshot held; between 2 and 3, entries without COPIED
//! on clusters with refcount 1 again (as above, and as QEMU leaves them).

use std::io;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::range_lock::{Mode, RangeGuard, Span};
use crate::{BlockBackend, Ctx};

use super::alloc::Allocator;
use super::entry::{self, Mapping, COPIED};
use super::snapshot::{self, Snapshot, SnapshotInfo, MAX_SNAPSHOTS, MAX_TABLE_BYTES};
use super::Qcow2Backend;

/// The header's `nb_snapshots` (4 bytes) and `snapshots_offset` (8) that follow it.
const NB_SNAPSHOTS_FIELD: u64 = 60;

/// Where the snapshot table is: its offset, entries and bytes.
pub(super) struct TableAt {
    pub(super) offset: u64,
    pub(super) count: u32,
    pub(super) len: u64,
}

impl Qcow2Backend {
    /// [`BlockBackend::snapshot_create`] (module docs).
    pub(super) fn create_snapshot(&self, cx: &Ctx<'_>, name: &str) -> io::Result<SnapshotInfo> {
        let alloc = self.check_writable()?;
        if name.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "Name is empty"));
        }
        let _quiet = self.quiesce(cx);
        let (snapshots, raw) = self.read_snapshots(cx)?;
        if snapshots.iter().any(|s| s.name == name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("Snapshot with name '{name}' already exists"),
            ));
        }
        let info = new_info(&snapshots, name);
        let l1 = self.l1_entries();
        let probe = snapshot::encode(&info, 0, 0, 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "snapshot name too long"))?;
        if snapshots.len() >= MAX_SNAPSHOTS as usize
            || (raw.len() + probe.len()) as u64 > MAX_TABLE_BYTES
        {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        BlockBackend::flush(self, cx)?;
        let mut refs = Vec::new();
        self.references(cx, &l1, &mut refs)?;
        refs.sort_unstable();
        alloc.check_refcount_change(cx, &self.host, &refs, 1)?;
        // 1.
        let l1_copy = self.write_l1_copy(cx, alloc, &l1)?;
        self.rewrite_copied(cx, &|_| false)?;
        self.host.file.flush(cx)?;
        // 2.
        alloc.change_refcounts(cx, &self.host, &refs, 1)?;
        let entry = snapshot::encode(&info, l1_copy, l1.len() as u32, self.len())
            .expect("its length was checked");
        let mut table = raw;
        table.extend_from_slice(&entry);
        // 3. and 4.
        self.switch_table(cx, alloc, &table, snapshots.len() as u32 + 1)?;
        Ok(info)
    }

    /// [`BlockBackend::snapshot_delete`] (module docs).
    pub(super) fn delete_snapshot(
        &self,
        cx: &Ctx<'_>,
        id: Option<&str>,
        name: Option<&str>,
    ) -> io::Result<SnapshotInfo> {
        if id.is_none() && name.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "Name or id must be provided",
            ));
        }
        let _quiet = self.quiesce(cx);
        let (snapshots, raw) = self.read_snapshots(cx)?;
        let matches = |s: &&Snapshot| {
            id.is_none_or(|id| s.id == id) && name.is_none_or(|name| s.name == name)
        };
        let Some(s) = snapshots.iter().find(matches) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "Snapshot with id '{}' and name '{}' does not exist",
                    id.unwrap_or("null"),
                    name.unwrap_or("null")
                ),
            ));
        };
        let alloc = self.alloc.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "Failed to remove snapshot from snapshot list: Operation not permitted",
            )
        })?;
        BlockBackend::flush(self, cx)?;
        // 1.
        let mut table = raw[..s.span.start].to_vec();
        table.extend_from_slice(&raw[s.span.end..]);
        self.switch_table(cx, alloc, &table, snapshots.len() as u32 - 1)?;
        // 2.
        let mut l1_raw = vec![0u8; s.l1_size as usize * 8];
        self.host.read_exact(cx, &mut l1_raw, s.l1_table_offset)?;
        let l1: Vec<u64> = l1_raw
            .chunks_exact(8)
            .map(|e| u64::from_be_bytes(e.try_into().expect("8 bytes")))
            .collect();
        let mut refs = self.clusters_of(s.l1_table_offset, l1_raw.len() as u64);
        self.references(cx, &l1, &mut refs)?;
        refs.sort_unstable();
        alloc.change_refcounts(cx, &self.host, &refs, -1)?;
        self.host.file.flush(cx)?;
        // 3.
        let mut active = Vec::new();
        self.references(cx, &self.l1_entries(), &mut active)?;
        active.sort_unstable();
        active.dedup();
        let counts = alloc.refcounts_of(cx, &self.host, &active)?;
        let owned = |c: u64| active.binary_search(&c).is_ok_and(|i| counts[i] == 1);
        self.rewrite_copied(cx, &owned)?;
        self.host.file.flush(cx)?;
        Ok(SnapshotInfo::from(s))
    }

    /// Every guest cluster and every L1 entry held exclusively (and the resize lock, taken
    /// first as a resize takes it): no request changes or reads a table meanwhile.
    fn quiesce(&self, cx: &Ctx<'_>) -> [RangeGuard<'_>; 3] {
        let clusters = self.hold(cx, 0, u64::MAX, Mode::Exclusive);
        let resize = Span {
            start: u64::MAX - 1,
            end: u64::MAX,
        };
        let resize = self.l1_locks.lock(cx, resize, Mode::Exclusive);
        let entries = Span {
            start: 0,
            end: u64::MAX - 1,
        };
        let entries = self.l1_locks.lock(cx, entries, Mode::Exclusive);
        [clusters, resize, entries]
    }

    fn table_at(&self) -> std::sync::MutexGuard<'_, TableAt> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The snapshots and the table's bytes, as they are now.
    fn read_snapshots(&self, cx: &Ctx<'_>) -> io::Result<(Vec<Snapshot>, Vec<u8>)> {
        let (offset, count) = {
            let t = self.table_at();
            (t.offset, t.count)
        };
        snapshot::read_table_at(cx, &self.host, &self.h, offset, count)
    }

    /// The active L1 entries.
    fn l1_entries(&self) -> Vec<u64> {
        let t = self.l1.read();
        t.entries
            .iter()
            .map(|e| e.load(Ordering::Acquire))
            .collect()
    }

    /// The host clusters `[at, at + len)` covers, as indices.
    fn clusters_of(&self, at: u64, len: u64) -> Vec<u64> {
        let first = at >> self.h.cluster_bits;
        (first..first + len.div_ceil(self.cluster_size())).collect()
    }

    /// Appends to `out` the host cluster of every L2 table that `l1` names and of every
    /// cluster those tables map (a compressed one's clusters each).
    fn references(&self, cx: &Ctx<'_>, l1: &[u64], out: &mut Vec<u64>) -> io::Result<()> {
        let mut raw = vec![0u8; self.cluster_size() as usize];
        for table in l1.iter().filter_map(|&e| entry::l2_table(e)) {
            out.push(table >> self.h.cluster_bits);
            self.host.read_exact(cx, &mut raw, table)?;
            for e in raw.chunks_exact(8) {
                let e = u64::from_be_bytes(e.try_into().expect("8 bytes"));
                out.extend(
                    Mapping::decode(e, self.h.cluster_bits).host_clusters(self.h.cluster_bits),
                );
            }
        }
        Ok(())
    }

    /// Writes `l1` to new clusters, without COPIED bits; returns its offset (0 if empty).
    fn write_l1_copy(&self, cx: &Ctx<'_>, alloc: &Allocator, l1: &[u64]) -> io::Result<u64> {
        if l1.is_empty() {
            return Ok(0);
        }
        let raw: Vec<u8> = l1
            .iter()
            .flat_map(|e| (e & !COPIED).to_be_bytes())
            .collect();
        let n = (raw.len() as u64).div_ceil(self.cluster_size());
        let at = alloc.contiguous(cx, &self.host, n)?;
        self.host.write(cx, &raw, at)?;
        Ok(at)
    }

    /// Makes the COPIED bit of each active L1 entry and each data (or preallocated zero)
    /// L2 entry say `owned(host cluster)`, writing the tables that change (not synced) and
    /// dropping them from the L2 cache.
    fn rewrite_copied(&self, cx: &Ctx<'_>, owned: &dyn Fn(u64) -> bool) -> io::Result<()> {
        let bits = self.h.cluster_bits;
        let flag = |e: u64, host: u64| match owned(host >> bits) {
            true => e | COPIED,
            false => e & !COPIED,
        };
        let mut l1 = self.l1_entries();
        let mut raw = vec![0u8; self.cluster_size() as usize];
        for e in l1.iter_mut() {
            let Some(table) = entry::l2_table(*e) else {
                continue;
            };
            *e = flag(*e, table);
            self.host.read_exact(cx, &mut raw, table)?;
            let mut changed = false;
            for bytes in raw.chunks_exact_mut(8) {
                let old = u64::from_be_bytes((&*bytes).try_into().expect("8 bytes"));
                let new = match Mapping::decode(old, bits) {
                    Mapping::Data { host, .. } | Mapping::Zero { host } if host != 0 => {
                        flag(old, host)
                    }
                    _ => old,
                };
                if new != old {
                    bytes.copy_from_slice(&new.to_be_bytes());
                    changed = true;
                }
            }
            if changed {
                self.host.write(cx, &raw, table)?;
                self.l2.forget(table);
            }
        }
        if self.l1_entries() != l1 {
            // The table stays put: a move takes the resize lock, which is held here.
            let offset = self.l1.read().offset;
            let bytes: Vec<u8> = l1.iter().flat_map(|e| e.to_be_bytes()).collect();
            self.host.write(cx, &bytes, offset)?;
            for (slot, &e) in self.l1.read().entries.iter().zip(&l1) {
                slot.store(e, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Makes `raw` (`count` entries) the snapshot table: written to new clusters (none if
    /// empty) and synced, the header switched to it in one write and synced, the old
    /// table's clusters freed.
    fn switch_table(
        &self,
        cx: &Ctx<'_>,
        alloc: &Allocator,
        raw: &[u8],
        count: u32,
    ) -> io::Result<()> {
        let at = match count {
            0 => 0,
            _ => {
                let n = (raw.len() as u64).div_ceil(self.cluster_size());
                let at = alloc.contiguous(cx, &self.host, n)?;
                self.host.write(cx, raw, at)?;
                at
            }
        };
        self.host.file.flush(cx)?;
        let mut fields = [0u8; 12];
        fields[..4].copy_from_slice(&count.to_be_bytes());
        fields[4..].copy_from_slice(&at.to_be_bytes());
        self.host.write(cx, &fields, NB_SNAPSHOTS_FIELD)?;
        self.host.file.flush(cx)?;
        let new = TableAt {
            offset: at,
            count,
            len: raw.len() as u64,
        };
        let old = std::mem::replace(&mut *self.table_at(), new);
        self.snapshots.store(count as usize, Ordering::Relaxed);
        match old.count {
            0 => Ok(()),
            _ => alloc.apply_frees(cx, &self.host, self.clusters_of(old.offset, old.len)),
        }
    }
}

/// The entry of a new disk-only snapshot named `name`, as qemu-storage-daemon 10.0 makes
/// it: the next ID (one past the largest numeric ID, as QEMU's `find_new_snapshot_id`),
/// the date in microseconds, the VM clock (qsd's runs with the host's clock: the same
/// instant in nanoseconds), no VM state, no instruction count.
fn new_info(snapshots: &[Snapshot], name: &str) -> SnapshotInfo {
    let max = snapshots
        .iter()
        .map(|s| s.id.parse::<u64>().unwrap_or(0))
        .max()
        .unwrap_or(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let date_nsec = now.subsec_micros() * 1000;
    SnapshotInfo {
        id: (max + 1).to_string(),
        name: name.to_owned(),
        vm_state_size: 0,
        date_sec: now.as_secs() as u32,
        date_nsec,
        vm_clock_nsec: now.as_secs() * 1_000_000_000 + date_nsec as u64,
        icount: None,
    }
}
