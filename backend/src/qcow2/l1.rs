//! The L1 table, in memory in full, as on disk: one entry per L2 table. It changes place
//! only when a resize grows it (`resize.rs`), which swaps the whole table under the write
//! lock; everything else reads entries under the read lock, held for an atomic load or
//! store and never across I/O, so a coroutine never blocks its loop on it for long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

/// The entries and where they are in the file.
pub(crate) struct L1Table {
    pub(crate) entries: Vec<AtomicU64>,
    /// Host offset of the table.
    pub(crate) offset: u64,
}

/// The L1 table of one image.
pub(crate) struct L1(RwLock<L1Table>);

impl L1 {
    /// The table decoded from its bytes `raw` at host offset `offset`.
    pub(crate) fn new(raw: &[u8], offset: u64) -> L1 {
        L1(RwLock::new(L1Table {
            entries: decode(raw),
            offset,
        }))
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, L1Table> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Entry `index`, `None` past the end.
    pub(crate) fn get(&self, index: usize) -> Option<u64> {
        let t = self.read();
        t.entries.get(index).map(|e| e.load(Ordering::Acquire))
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.read().entries.len()
    }

    /// Replaces the table (grown, and at `offset` now) by the one in `raw`.
    pub(crate) fn replace(&self, raw: &[u8], offset: u64) {
        let mut t = self.0.write().unwrap_or_else(|e| e.into_inner());
        (t.entries, t.offset) = (decode(raw), offset);
    }
}

fn decode(raw: &[u8]) -> Vec<AtomicU64> {
    raw.chunks_exact(8)
        .map(|e| AtomicU64::new(u64::from_be_bytes(e.try_into().expect("8 bytes"))))
        .collect()
}
