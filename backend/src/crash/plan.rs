//! Crash states from a log: which image-level records a crash at a given point leaves on
//! the disk, and how (whole, torn or not at all).
//!
//! The log is cut into *windows*, one per image-level flush and one after the last: window
//! k holds the records from the `begun` of flush k-1 (the records it covers are durable;
//! nothing before flush 1) up to flush k's own record. A crash anywhere before flush k
//! returns keeps:
//! - every record below the window (durable), in log order;
//! - every durable write (`RWF_DSYNC`) of the window, whole, in log order;
//! - any subset of the other records of the window, in any order, each cut at sector
//!   boundaries, except that none overwrites a durable write of the window that came after
//!   it (that write reached the disk after it).
//!
//! So the per-sector candidates are exactly what a volatile cache may leave: the durable
//! value or any value written since. Writes of one window that overlap can land in either
//! order.
//!
//! A resize (an `ftruncate`) followed in its window by a durable write is kept too: Linux
//! documents `RWF_DSYNC` as "as though each write was followed by fdatasync", and
//! fdatasync(2) as flushing "a change to the file size (st_size, as made by say
//! ftruncate(2))"; ext4 and XFS commit the inode's size with any datasync of it. The qcow2
//! allocator relies on that (it extends the file over a reservation, then writes the
//! reservation's refcounts with `RWF_DSYNC`). POSIX alone promises less (only what is
//! needed to read back the data written).

use std::ops::Range;

use crate::record::{Kind, Level, Record};

/// One window of the log: `durable` records lie below `start`; `[start, end)` may be lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The first record a crash may lose: the `begun` of the flush before (0 for the first).
    pub start: usize,
    /// The crash point: the index of the flush that closes the window (or the log's end).
    pub end: usize,
    /// The number of the image-level flush that closes it (0: none, the log's tail).
    pub flush: u64,
}

/// A record kept in a crash state, with the byte ranges (relative to its offset) kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    /// The record's index.
    pub index: usize,
    /// Relative byte ranges of the record kept (all of it when whole).
    pub pieces: Vec<Range<u64>>,
}

/// What one crash state holds on top of the window's durable part, in application order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// The window.
    pub window: Window,
    /// Volatile records kept, in the order applied (after the window's durable writes).
    pub kept: Vec<Kept>,
}

/// The windows of `records`.
pub fn windows(records: &[Record]) -> Vec<Window> {
    let mut out = Vec::new();
    let mut start = 0;
    for r in records {
        let h = &r.head;
        if h.level == Level::Image && h.kind == Kind::Flush && !h.failed() {
            let end = h.index as usize;
            out.push(Window {
                start,
                end,
                flush: h.offset,
            });
            start = start.max(h.begun as usize);
        }
    }
    out.push(Window {
        start,
        end: records.len(),
        flush: 0,
    });
    out
}

/// Whether `r` changes the image (an image-level record other than a flush).
pub fn modifies(r: &Record) -> bool {
    r.head.level == Level::Image && r.head.kind != Kind::Flush
}

/// Whether `r` is durable on completion: a successful durable write.
pub fn is_durable(r: &Record) -> bool {
    r.head.kind == Kind::DurableWrite && !r.head.failed()
}

/// Whether record `i` of window `w` survives any crash at the window's end: a durable
/// write, or a resize that a durable write begun after it made durable (see the module
/// doc).
pub fn is_pinned(records: &[Record], w: Window, i: usize) -> bool {
    let r = &records[i];
    match r.head.kind {
        _ if r.head.failed() => false,
        Kind::DurableWrite => true,
        Kind::Resize => records[i + 1..w.end]
            .iter()
            .any(|d| modifies(d) && is_durable(d) && d.head.begun as usize > i),
        _ => false,
    }
}

/// A small seedable generator (splitmix64), so that a seed names the same states on every
/// machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// The state "everything up to the crash point reached the disk", in log order.
pub fn everything(records: &[Record], w: Window) -> State {
    let kept = (w.start..w.end)
        .filter(|&i| modifies(&records[i]) && !is_pinned(records, w, i))
        .map(|i| Kept {
            index: i,
            pieces: std::iter::once(0..records[i].head.len).collect(),
        })
        .collect();
    State { window: w, kept }
}

/// A random crash state of window `w`: a random subset of its volatile records in a
/// random order, each whole or torn at `sector` boundaries (absolute, in the file).
pub fn random(records: &[Record], w: Window, sector: u64, rng: &mut Rng) -> State {
    let mut candidates: Vec<usize> = (w.start..w.end)
        .filter(|&i| modifies(&records[i]) && !is_pinned(records, w, i))
        .collect();
    // Fisher-Yates, then keep each with probability 1/2 (or a bias drawn per state).
    for i in (1..candidates.len()).rev() {
        candidates.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let keep_per_mille = rng.below(1001);
    let mut kept = Vec::new();
    for i in candidates {
        if rng.below(1000) >= keep_per_mille {
            continue;
        }
        let pieces = surviving(records, w, i);
        let pieces = tear(&records[i], pieces, sector, rng);
        if !pieces.is_empty() {
            kept.push(Kept { index: i, pieces });
        }
    }
    State { window: w, kept }
}

/// The relative ranges of record `i` not overwritten by a durable write of the window
/// that came after it.
pub fn surviving(records: &[Record], w: Window, i: usize) -> Vec<Range<u64>> {
    let h = &records[i].head;
    if h.kind == Kind::Resize {
        return std::iter::once(0..0).collect();
    }
    let mut pieces: Vec<_> = std::iter::once(0..h.len).collect();
    for later in &records[i + 1..w.end] {
        if !modifies(later) || !is_durable(later) {
            continue;
        }
        let (s, e) = (later.head.offset, later.head.offset + later.head.len);
        let cut = s.saturating_sub(h.offset)..e.saturating_sub(h.offset).min(h.len);
        pieces = pieces.into_iter().flat_map(|p| minus(p, &cut)).collect();
    }
    pieces
}

fn minus(p: Range<u64>, cut: &Range<u64>) -> Vec<Range<u64>> {
    if cut.start >= p.end || cut.end <= p.start || cut.is_empty() {
        return vec![p];
    }
    [p.start..cut.start.max(p.start), cut.end.min(p.end)..p.end]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect()
}

/// Keeps `pieces` of `rec` whole (half the time), or a prefix of its sectors, or a
/// random subset of them. Sectors are absolute: `sector`-aligned in the file.
fn tear(
    rec: &crate::record::Record,
    pieces: Vec<Range<u64>>,
    sector: u64,
    rng: &mut Rng,
) -> Vec<Range<u64>> {
    if rec.head.kind == Kind::Resize || rng.below(2) == 0 {
        return pieces;
    }
    let base = rec.head.offset;
    let mut sectors = Vec::new();
    for p in pieces {
        let mut at = p.start;
        while at < p.end {
            let next = ((base + at) / sector + 1) * sector - base;
            let end = next.min(p.end);
            sectors.push(at..end);
            at = end;
        }
    }
    match rng.below(2) {
        0 => {
            let n = rng.below(sectors.len() as u64 + 1) as usize;
            sectors.truncate(n);
            sectors
        }
        _ => sectors.into_iter().filter(|_| rng.below(2) == 0).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Head;

    fn rec(index: u64, kind: Kind, begun: u64, offset: u64, len: u64) -> Record {
        let head = Head {
            kind,
            level: Level::Image,
            flags: 0,
            index,
            begun,
            offset,
            len,
        };
        let data = match kind.has_data() {
            true => vec![index as u8; len as usize],
            false => Vec::new(),
        };
        Record { head, data }
    }

    #[test]
    fn windows_start_where_the_flush_before_began() {
        let log = [
            rec(0, Kind::Write, 0, 0, 512),
            rec(1, Kind::Write, 1, 512, 512),
            // Began before #1 completed: covers #0 only.
            rec(2, Kind::Flush, 1, 1, 0),
            rec(3, Kind::Write, 3, 0, 512),
        ];
        let w = windows(&log);
        assert_eq!(
            w,
            [
                Window {
                    start: 0,
                    end: 2,
                    flush: 1
                },
                Window {
                    start: 1,
                    end: 4,
                    flush: 0
                }
            ]
        );
    }

    #[test]
    fn a_volatile_write_never_lands_over_a_later_durable_one() {
        let log = [
            rec(0, Kind::Write, 0, 0, 2048),
            rec(1, Kind::DurableWrite, 1, 512, 512),
        ];
        let w = windows(&log)[0];
        assert_eq!(surviving(&log, w, 0), [0..512, 1024..2048]);
        let mut rng = Rng::new(1);
        for _ in 0..200 {
            let s = random(&log, w, 512, &mut rng);
            for k in &s.kept {
                assert!(k.pieces.iter().all(|p| p.end <= 512 || p.start >= 1024));
                assert!(k.pieces.iter().all(|p| p.start % 512 == 0 || p.is_empty()));
            }
        }
    }
}
