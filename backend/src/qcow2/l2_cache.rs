//! A bounded cache of L2 tables, in slots allocated once at open: a lookup in steady state
//! allocates nothing, whether it hits or misses.
//!
//! One mutex guards the slots and is never held across I/O. A miss claims the least
//! recently used slot (marking it `Loading`), lets go of the mutex, reads the table into a
//! pooled buffer and decodes it into the slot. Lookups of a table that is loading wait for
//! it (see [`Waiter`]) instead of reading it twice.
//!
//! Updates are written to the file first and to the cache after (`set`): a load that began
//! before the file write may have read the old entry, so an update that finds its table
//! loading marks the load stale and the loader reads it again.
//!
//! Some updates wait for the next flush instead (`defer`, `deferred.rs`): the cache holds
//! them beside the slots, at most [`MAX_DEFERRED`], until they are written back. A table
//! read from the file gets them laid over it, so that evicting a slot never loses one.
//!
//! [`Waiter`]: crate::range_lock

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use crate::pool::BouncePool;
use crate::Ctx;

use super::hostio::{self, Host};

/// Bytes of L2 tables to keep: 4 MiB maps 32 GiB of a disk with 64 KiB clusters.
const BUDGET: u64 = 4 << 20;
const MIN_SLOTS: u64 = 8;
/// Most entries waiting for a flush: when full, the next deferral writes them back first
/// (a sync of every copy since the last one). 32768: 2 GiB of 64 KiB copies between two
/// syncs; 4096 made fio 4 KiB random writes over a 1 GiB backing file ~0.5x as fast at
/// iodepth 1 (a sync of 256 MiB every 4096 copies), and costs ~1.6 MiB per writable image
/// (this map and the write-back's batch), allocated at open.
pub(crate) const MAX_DEFERRED: usize = 32768;

/// An entry waiting to be written back: (table offset, index, entry).
pub(crate) type Deferred = (u64, usize, u64);

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    /// Being read; `stale` if an entry was updated meanwhile.
    Loading {
        stale: bool,
    },
    Ready,
}

struct Slot {
    /// Host offset of the table held (0 when empty).
    table: u64,
    state: State,
    last_use: u64,
    entries: Box<[u64]>,
}

struct Slots {
    slots: Vec<Slot>,
    /// Table offset to slot, for every slot not empty; its capacity is the slot count, so
    /// it never reallocates.
    index: HashMap<u64, usize>,
    /// Entries newer than the file's, by (table, index), waiting for a flush; its capacity
    /// is [`MAX_DEFERRED`], so it never reallocates either.
    deferred: HashMap<(u64, usize), u64>,
    clock: u64,
}

/// The L2 tables of one image.
pub(crate) struct L2Cache {
    slots: Mutex<Slots>,
    /// Buffers to read a table into (one per load in flight).
    bufs: BouncePool,
    misses: std::sync::atomic::AtomicU64,
}

impl L2Cache {
    /// A cache for tables of `cluster_size` bytes, for an image with `l1_size` tables.
    pub(crate) fn new(cluster_size: u64, l1_size: u32) -> L2Cache {
        let count = (BUDGET / cluster_size)
            .max(MIN_SLOTS)
            .min((l1_size as u64).max(MIN_SLOTS)); // a resize may add tables
        let entries = (cluster_size / 8) as usize;
        let slots = (0..count)
            .map(|_| Slot {
                table: 0,
                state: State::Empty,
                last_use: 0,
                entries: vec![0; entries].into_boxed_slice(),
            })
            .collect();
        L2Cache {
            slots: Mutex::new(Slots {
                slots,
                index: HashMap::with_capacity(count as usize),
                deferred: HashMap::with_capacity(MAX_DEFERRED),
                clock: 0,
            }),
            bufs: BouncePool::new(cluster_size as usize, 4096, 8),
            misses: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entry `index` of the L2 table at host offset `table`.
    pub(crate) fn get(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        table: u64,
        index: usize,
    ) -> io::Result<u64> {
        let mut nap = hostio::Nap::default();
        loop {
            let mut s = self.lock();
            s.clock += 1;
            let clock = s.clock;
            if let Some(&at) = s.index.get(&table) {
                let slot = &mut s.slots[at];
                if slot.state == State::Ready {
                    slot.last_use = clock;
                    return Ok(slot.entries[index]);
                }
                drop(s);
                nap.wait(cx); // loading elsewhere
                continue;
            }
            let Some(victim) = s.victim() else {
                drop(s);
                nap.wait(cx); // every slot is loading: as many misses in flight as slots
                continue;
            };
            let slot = &mut s.slots[victim];
            let old = std::mem::replace(&mut slot.table, table);
            (slot.state, slot.last_use) = (State::Loading { stale: false }, clock);
            s.index.remove(&old);
            s.index.insert(table, victim);
            drop(s);
            if let Some(entry) = self.load(cx, host, victim, table, index)? {
                return Ok(entry);
            }
        }
    }

    /// Reads the table into slot `victim`; `None` if an update made the read stale.
    fn load(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        victim: usize,
        table: u64,
        index: usize,
    ) -> io::Result<Option<u64>> {
        self.misses
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut buf = self.bufs.take();
        let read = host.read_exact(cx, &mut buf, table);
        let mut s = self.lock();
        match (read, s.slots[victim].state) {
            (Err(e), _) => {
                s.empty(victim);
                Err(e)
            }
            (Ok(()), State::Loading { stale: true }) => {
                s.empty(victim);
                Ok(None)
            }
            (Ok(()), _) => {
                let s = &mut *s;
                let slot = &mut s.slots[victim];
                for (e, raw) in slot.entries.iter_mut().zip(buf.chunks_exact(8)) {
                    *e = u64::from_be_bytes(raw.try_into().expect("8 bytes"));
                }
                if !s.deferred.is_empty() {
                    for (&(t, i), &entry) in &s.deferred {
                        if t == table {
                            slot.entries[i] = entry;
                        }
                    }
                }
                slot.state = State::Ready;
                Ok(Some(slot.entries[index]))
            }
        }
    }

    /// Records that entry `index` of `table` is now `entry` on disk.
    pub(crate) fn set(&self, table: u64, index: usize, entry: u64) {
        let mut s = self.lock();
        if let Some(&at) = s.index.get(&table) {
            let slot = &mut s.slots[at];
            match slot.state {
                State::Ready => slot.entries[index] = entry,
                State::Loading { .. } => slot.state = State::Loading { stale: true },
                State::Empty => {}
            }
        }
    }

    /// Whether entry `index` of `table` waits for a flush (its next update must wait too:
    /// written now, it would be overwritten by the older one).
    pub(crate) fn is_deferred(&self, table: u64, index: usize) -> bool {
        self.lock().deferred.contains_key(&(table, index))
    }

    /// Makes `entry` entry `index` of `table`, in the cache only, until a write-back;
    /// `false` (nothing done) if [`MAX_DEFERRED`] entries wait already.
    pub(crate) fn defer(&self, table: u64, index: usize, entry: u64) -> bool {
        let mut s = self.lock();
        let key = (table, index);
        if s.deferred.len() >= MAX_DEFERRED && !s.deferred.contains_key(&key) {
            return false;
        }
        s.deferred.insert(key, entry);
        if let Some(&at) = s.index.get(&table) {
            let slot = &mut s.slots[at];
            if slot.state == State::Ready {
                slot.entries[index] = entry;
            } // a load in flight lays the deferred entries over what it read
        }
        true
    }

    /// Copies the entries waiting for a flush into `out` (cleared first; its capacity
    /// [`MAX_DEFERRED`] is enough). They stay deferred until [`written_back`].
    ///
    /// [`written_back`]: L2Cache::written_back
    pub(crate) fn deferred_into(&self, out: &mut Vec<Deferred>) {
        out.clear();
        let s = self.lock();
        out.extend(s.deferred.iter().map(|(&(t, i), &e)| (t, i, e)));
    }

    /// Records that `entry`, deferred, is now entry `index` of `table` on disk: it waits
    /// no more unless it was updated meanwhile.
    pub(crate) fn written_back(&self, table: u64, index: usize, entry: u64) {
        let mut s = self.lock();
        if s.deferred.get(&(table, index)) == Some(&entry) {
            s.deferred.remove(&(table, index));
        }
        if let Some(&at) = s.index.get(&table) {
            if let State::Loading { .. } = s.slots[at].state {
                s.slots[at].state = State::Loading { stale: true };
            }
        }
    }

    /// Drops the table at `table`, which the image no longer uses (its cluster may be
    /// freed and reused), with its entries waiting for a flush: a load in flight is made
    /// stale, so that it reads again.
    pub(crate) fn forget(&self, table: u64) {
        let mut s = self.lock();
        s.deferred.retain(|&(t, _), _| t != table);
        if let Some(&at) = s.index.get(&table) {
            match s.slots[at].state {
                State::Ready => s.empty(at),
                State::Loading { .. } => s.slots[at].state = State::Loading { stale: true },
                State::Empty => {}
            }
        }
    }

    /// Tables read from the file so far.
    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Slots {
    fn empty(&mut self, at: usize) {
        let slot = &mut self.slots[at];
        let table = std::mem::take(&mut slot.table);
        slot.state = State::Empty;
        self.index.remove(&table);
    }

    /// The slot to load into: an empty one, else the least recently used ready one.
    fn victim(&self) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !matches!(s.state, State::Loading { .. }))
            .min_by_key(|(_, s)| (s.state != State::Empty, s.last_use))
            .map(|(i, _)| i)
    }
}
