//! L2 entries that wait for a flush, as QEMU's qcow2 L2 cache entries that "depend on a
//! flush" (`qcow2_cache_depends_on_flush`).
//!
//! A copy-on-write cluster (a partial write into a cluster whose other bytes come from the
//! backing file, a snapshot's or compressed data, or zeroes over a reused cluster) holds
//! bytes the guest never wrote and never flushed: a power loss that kept its L2 entry and
//! lost its data would show them as garbage. Syncing each such cluster before linking it
//! (`RWF_DSYNC`) was correct but cost a device flush per copy: on ext4, 4 KiB random
//! writes over a backing file fell from ~28k to ~0.9k IOPS at iodepth 1. So its entry is
//! deferred instead: the L2 cache serves it at once (`L2Cache::defer`), and the file gets
//! it only at the next write-back, which syncs the file first. A crash state can hold the
//! entry only with the data it links.
//!
//! # Contract
//! - A write-back (`write_back`) syncs the file, then writes the deferred entries (runs of
//!   adjacent ones in one write). One at a time (`gate`), so that a flush's frees wait
//!   for the write-back of the entries that unlinked them.
//! - A flush writes back, then syncs: every entry deferred before it is durable on return.
//! - An update of an entry that is deferred is deferred too (`Qcow2Backend::set_l2`):
//!   written at once, it would be overwritten by the older one.
//! - At most [`MAX_DEFERRED`] entries wait; a deferral past that writes back first.
//! - A table unlinked (`L2Cache::forget`) takes its deferred entries with it: its cluster
//!   is freed after the next flush and may be reused.

use std::io;
use std::sync::{Mutex, MutexGuard};

use crate::range_lock::{Mode, RangeLocks, Span};
use crate::Ctx;

use super::l2_cache::{Deferred, MAX_DEFERRED};
use super::Qcow2Backend;

/// Most adjacent entries written back in one write.
const RUN: usize = 64;

/// The write-back's own state.
pub(super) struct WriteBack {
    /// Held exclusively by the write-back running.
    gate: RangeLocks,
    /// The entries being written back (only the gate's holder locks it).
    batch: Mutex<Vec<Deferred>>,
}

impl Default for WriteBack {
    fn default() -> WriteBack {
        WriteBack {
            gate: RangeLocks::default(),
            batch: Mutex::new(Vec::with_capacity(MAX_DEFERRED)),
        }
    }
}

impl WriteBack {
    fn batch(&self) -> MutexGuard<'_, Vec<Deferred>> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Qcow2Backend {
    /// Links guest cluster `l2i` of `table` to `entry` at the next write-back; writes
    /// back first if too many entries wait.
    pub(super) fn defer_l2(
        &self,
        cx: &Ctx<'_>,
        table: u64,
        l2i: usize,
        entry: u64,
    ) -> io::Result<()> {
        while !self.l2.defer(table, l2i, entry) {
            self.write_back(cx)?;
        }
        Ok(())
    }

    /// Syncs the file, then writes the deferred L2 entries (module docs). Those that
    /// fail to be written stay deferred.
    pub(super) fn write_back(&self, cx: &Ctx<'_>) -> io::Result<()> {
        let one = Span { start: 0, end: 1 };
        let _gate = self.write_back.gate.lock(cx, one, Mode::Exclusive);
        let mut batch = self.write_back.batch();
        self.l2.deferred_into(&mut batch);
        if batch.is_empty() {
            return Ok(());
        }
        self.host.file.flush(cx)?; // the data before the entries that link it
        batch.sort_unstable();
        let mut raw = [0u8; 8 * RUN];
        for run in batch.chunk_by(|a, b| a.0 == b.0 && a.1 + 1 == b.1) {
            for part in run.chunks(RUN) {
                for (bytes, &(_, _, entry)) in raw.chunks_exact_mut(8).zip(part) {
                    bytes.copy_from_slice(&entry.to_be_bytes());
                }
                let (table, first, _) = part[0];
                let at = table + first as u64 * 8;
                self.host.write(cx, &raw[..8 * part.len()], at)?;
                for &(table, index, entry) in part {
                    self.l2.written_back(table, index, entry);
                }
            }
        }
        Ok(())
    }
}
