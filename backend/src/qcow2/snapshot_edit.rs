//! Making and deleting internal snapshots while the image serves (QMP
//! `blockdev-snapshot-internal-sync` and `blockdev-snapshot-delete-internal-sync`), in the
//! order of QEMU's block/qcow2-snapshot.c (`qcow2_snapshot_create`, `qcow2_snapshot_delete`)
//! and block/qcow2-refcount.c (`qcow2_update_snapshot_refcount`).
//!
//! Each holds every guest cluster and every L1 entry exclusively for its whole run
//! (requests wait, then go on) and flushes first, so that the tables on disk are the
//! whole truth: no L2 entry deferred, no free pending.
//!
//! # One header write switches everything
//! QEMU changes the active tables' COPIED bits and the refcounts in place, one after the
//! other: a power loss between them leaves entries whose COPIED bit disagrees with their
//! refcount, which `qemu-img check` reports as corruption ("ERROR OFLAG_COPIED"; the
//! crash-state checker found it in a first version that followed QEMU's order). No order
//! of in-place writes avoids that: the bit and the count live in different clusters. So
//! here nothing the header names is written before the switch; the new state is built
//! past the end of the file, where nothing refers to it, and one 32-byte header write
//! (bytes 40-71, one sector) switches the active L1 table, the refcount table (and its
//! length), `nb_snapshots` and `snapshots_offset` together:
//! 1. The reservation is given back (`Allocator::release`), so that the new counts are
//!    exact (and leaks a crash left are reclaimed on the way).
//! 2. The references of the image to be are counted as `qemu-img check` counts them
//!    (`repair::count_image`), with the active L1 table as it is: each active L2 table
//!    whose entries' COPIED bits would be wrong then is copied, with the bits right, past
//!    the end of the file; a new active L1 table (each entry's COPIED bit right too) and
//!    the new snapshot table follow it. Tables that need no change are shared.
//! 3. The references counted again, and a new refcount structure holding them written
//!    after that (`rebuild::write_blocks`): the old table and blocks, the old snapshot
//!    table, and whatever the change left unreferenced count 0 in it. Synced.
//! 4. The header switch, synced. The allocator then serves from the new refcounts (read
//!    before the switch: nothing after it can fail), the L2 cache forgets the tables no
//!    longer active.
//!
//! A power loss before 4 leaves the image as it was (plus unreferenced clusters past its
//! old end: free space, not even leaks); after it, the new image, exact.
//!
//! Making a snapshot: the active L1 table becomes the snapshot's, as it is; the active
//! state gets the new one. Its L2 tables that held clusters with refcount 1 (COPIED) are
//! copied (the active state's copy loses the bits, the snapshot keeps the old table); the
//! others are shared, as QEMU shares them all. Deleting one: the snapshot's L1 table, and
//! what only it reached, count 0; the active entries whose clusters are the active state's
//! alone again get their COPIED bit back (as QEMU's `qcow2_update_snapshot_refcount(..,
//! 0)` sets it), through copies of their tables.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::range_lock::{Mode, RangeGuard, Span};
use crate::{BlockBackend, Ctx};

use super::alloc::Allocator;
use super::entry::{self, Mapping, COPIED};
use super::refcount::Refcounts;
use super::snapshot::{self, Snapshot, SnapshotInfo, MAX_SNAPSHOTS, MAX_TABLE_BYTES};
use super::tally::Tally;
use super::{rebuild, repair, Qcow2Backend};

/// The header's `l1_table_offset` (8 bytes), which `refcount_table_offset` (8),
/// `refcount_table_clusters` (4), `nb_snapshots` (4) and `snapshots_offset` (8) follow.
const L1_TABLE_FIELD: u64 = 40;

/// Where the snapshot table is, and its entries.
pub(super) struct TableAt {
    pub(super) offset: u64,
    pub(super) count: u32,
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
        let probe = snapshot::encode(&info, 0, 0, 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "snapshot name too long"))?;
        if snapshots.len() >= MAX_SNAPSHOTS as usize
            || (raw.len() + probe.len()) as u64 > MAX_TABLE_BYTES
        {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        BlockBackend::flush(self, cx)?;
        let (l1_offset, l1_size) = self.l1_place();
        let entry = snapshot::encode(&info, l1_offset, l1_size, self.len())
            .expect("its length was checked");
        let mut table = raw;
        let span = table.len()..table.len() + entry.len();
        table.extend_from_slice(&entry);
        let mut all = snapshots;
        all.push(Snapshot {
            id: info.id.clone(),
            name: info.name.clone(),
            l1_table_offset: l1_offset,
            l1_size,
            disk_size: Some(self.len()),
            date_sec: info.date_sec,
            date_nsec: info.date_nsec,
            vm_clock_nsec: info.vm_clock_nsec,
            vm_state_size: 0,
            icount: None,
            span,
        });
        self.commit(cx, alloc, &all, &table)?;
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
        let mut table = raw[..s.span.start].to_vec();
        table.extend_from_slice(&raw[s.span.end..]);
        let left: Vec<Snapshot> = snapshots.iter().filter(|o| o.id != s.id).cloned().collect();
        self.commit(cx, alloc, &left, &table)?;
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

    /// The active L1 table's offset and entries.
    fn l1_place(&self) -> (u64, u32) {
        let t = self.l1.read();
        (t.offset, t.entries.len() as u32)
    }

    /// Makes `snapshots`, whose table is `raw`, the image's, with the active state as it
    /// is: the module docs' steps 1 to 4.
    fn commit(
        &self,
        cx: &Ctx<'_>,
        alloc: &Allocator,
        snapshots: &[Snapshot],
        raw: &[u8],
    ) -> io::Result<()> {
        let cs = self.cluster_size();
        alloc.release(cx, &self.host)?;
        let (l1_offset, l1_size) = self.l1_place();
        let mut h = self.h.clone();
        // 2. The active L2 tables counted, not its L1 table (a new snapshot's now).
        (h.l1_table_offset, h.l1_size) = (l1_offset, 0);
        (h.nb_snapshots, h.snapshots_offset) = (snapshots.len() as u32, 0);
        let max = Refcounts::with_table(&h, 0, Vec::new()).max();
        let file_end = self.host.file.len().div_ceil(cs);
        let mut t = Tally::new(file_end, max)?;
        repair::count_image(cx, &self.host, &h, snapshots, 0, &mut t)?;
        let mut l1 = self.l1_entries();
        let l1_raw: Vec<u8> = l1.iter().flat_map(|e| e.to_be_bytes()).collect();
        let what = || "the active L1 table".to_owned();
        repair::count_l2_tables(cx, &self.host, &h, &mut t, &l1_raw, &what)?;
        h.l1_size = l1_size;
        // The active tables, right for those counts, from the end of the file on.
        let mut next = file_end;
        let mut writes = Vec::new(); // once per snapshot made or deleted
        let mut replaced = Vec::new();
        for e in l1.iter_mut() {
            let Some(table) = entry::l2_table(*e) else {
                continue;
            };
            let mut bytes = vec![0u8; cs as usize];
            self.host.read_exact(cx, &mut bytes, table)?;
            if self.set_copied(&mut bytes, &t) {
                *e = (next * cs) | COPIED;
                writes.push((next * cs, bytes));
                replaced.push(table);
                next += 1;
            } else {
                *e = match t.get(table / cs) {
                    1 => table | COPIED,
                    _ => table,
                };
            }
        }
        let l1_raw: Vec<u8> = l1.iter().flat_map(|e| e.to_be_bytes()).collect();
        h.l1_table_offset = next * cs;
        next += (l1_raw.len() as u64).div_ceil(cs);
        if !snapshots.is_empty() {
            h.snapshots_offset = next * cs;
            next += (raw.len() as u64).div_ceil(cs);
        }
        self.host.file.resize(cx, next * cs)?;
        for (at, bytes) in &writes {
            self.host.write(cx, bytes, *at)?;
        }
        self.host.write(cx, &l1_raw, h.l1_table_offset)?;
        if !snapshots.is_empty() {
            self.host.write(cx, raw, h.snapshots_offset)?;
        }
        // 3.
        let mut t = Tally::new(next, max)?;
        repair::count_image(cx, &self.host, &h, snapshots, raw.len() as u64, &mut t)?;
        let r = rebuild::write_blocks(cx, &self.host, &h, &mut t)?;
        let table: Vec<u8> = r.table.iter().flat_map(|e| e.to_be_bytes()).collect();
        self.host.write(cx, &table, r.table_offset)?;
        let table_clusters = table.len() as u64 / cs;
        let table_offset = r.table_offset;
        let new_refcounts = alloc.prepare(cx, &self.host, r)?;
        self.host.file.flush(cx)?;
        // 4.
        let mut fields = [0u8; 32];
        fields[..8].copy_from_slice(&h.l1_table_offset.to_be_bytes());
        fields[8..16].copy_from_slice(&table_offset.to_be_bytes());
        fields[16..20].copy_from_slice(&(table_clusters as u32).to_be_bytes());
        fields[20..24].copy_from_slice(&h.nb_snapshots.to_be_bytes());
        fields[24..].copy_from_slice(&h.snapshots_offset.to_be_bytes());
        self.host.write(cx, &fields, L1_TABLE_FIELD)?;
        self.host.file.flush(cx)?;
        self.l1.replace(&l1_raw, h.l1_table_offset);
        for table in replaced {
            self.l2.forget(table);
        }
        alloc.replace_refcounts(cx, new_refcounts);
        *self.table_at() = TableAt {
            offset: h.snapshots_offset,
            count: h.nb_snapshots,
        };
        self.snapshots.store(snapshots.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Makes the COPIED bit of each data (or preallocated zero) entry of the L2 table
    /// `bytes` say whether `t` counts its cluster once; whether any changed.
    fn set_copied(&self, bytes: &mut [u8], t: &Tally) -> bool {
        let bits = self.h.cluster_bits;
        let mut changed = false;
        for raw in bytes.chunks_exact_mut(8) {
            let old = u64::from_be_bytes((&*raw).try_into().expect("8 bytes"));
            let new = match Mapping::decode(old, bits) {
                Mapping::Data { host, .. } | Mapping::Zero { host } if host != 0 => {
                    match t.get(host >> bits) {
                        1 => old | COPIED,
                        _ => old & !COPIED,
                    }
                }
                _ => old,
            };
            if new != old {
                raw.copy_from_slice(&new.to_be_bytes());
                changed = true;
            }
        }
        changed
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
