//! What the disk must hold after a crash: the guest's view, built from the log.
//!
//! The writes that count are the guest level's (what the export asked of a qcow2 image);
//! a log without guest records (a raw image) is its own guest. At a crash point `end`,
//! let G be the last successful flush of that level recorded below `end`: the operations
//! recorded below G's `begun` were acknowledged before G was issued, so they must read
//! back (with the durable writes recorded below `end`). Bytes that an operation not so
//! covered may have touched (recorded at or past G's `begun`, and begun below `end`: done
//! or in flight at the crash) may hold anything.

use std::ops::Range;

use crate::record::{Kind, Level, Record};

/// The guest's bytes as they must read after a crash at some point.
pub struct Model {
    /// Which level's records make the model.
    level: Level,
    /// Bytes of the covered operations applied so far (below `applied`).
    base: Vec<u8>,
    /// The disk's size after them.
    base_len: u64,
    applied: usize,
}

/// The model at one crash point.
pub struct Expect {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The size the disk must have at least (unless `len_uncertain`).
    pub len: u64,
    /// An uncovered resize or growth may have happened.
    pub len_uncertain: bool,
    /// Ranges that may hold anything, sorted and merged.
    pub uncertain: Vec<Range<u64>>,
    /// The flush the model goes by (its record's index), if any.
    pub flush: Option<usize>,
}

impl Model {
    /// The model of a disk that held `initial` before the log, for `records`.
    pub fn new(initial: Vec<u8>, records: &[Record]) -> Model {
        let level = match records.iter().any(|r| r.head.level == Level::Guest) {
            true => Level::Guest,
            false => Level::Image,
        };
        Model {
            level,
            base_len: initial.len() as u64,
            base: initial,
            applied: 0,
        }
    }

    /// What must read back after a crash at `end` (records below it completed). Crash
    /// points must come in increasing order.
    pub fn at(&mut self, records: &[Record], end: usize) -> Expect {
        let flush = records[..end]
            .iter()
            .rev()
            .find(|r| r.head.level == self.level && r.head.kind == Kind::Flush && !r.head.failed());
        let covered = flush.map_or(0, |f| f.head.begun as usize);
        for r in &records[self.applied.min(covered)..covered] {
            if r.head.level == self.level && !r.head.failed() {
                apply(&mut self.base, &mut self.base_len, r);
            }
        }
        self.applied = self.applied.max(covered);
        let mut bytes = self.base.clone();
        let mut len = self.base_len;
        let mut uncertain = Vec::new();
        let mut len_uncertain = false;
        for r in &records[covered..] {
            let h = &r.head;
            if h.level != self.level || h.kind == Kind::Flush || h.begun as usize >= end {
                continue;
            }
            if h.kind == Kind::DurableWrite && (h.index as usize) < end && !h.failed() {
                apply(&mut bytes, &mut len, r);
                continue;
            }
            match h.kind {
                Kind::Resize => len_uncertain = true,
                _ => {
                    uncertain.push(h.offset..h.offset + h.len);
                    len_uncertain |= h.offset + h.len > len && h.kind != Kind::Discard;
                }
            }
        }
        Expect {
            bytes,
            len,
            len_uncertain,
            uncertain: merge(uncertain),
            flush: flush.map(|f| f.head.index as usize),
        }
    }
}

/// Applies a guest-level (or raw) record to the model's bytes.
fn apply(bytes: &mut Vec<u8>, len: &mut u64, r: &Record) {
    let h = &r.head;
    let end = (h.offset + h.len) as usize;
    let grow = |bytes: &mut Vec<u8>, len: &mut u64, to: usize| {
        if to > bytes.len() {
            bytes.resize(to, 0);
        }
        *len = (*len).max(to as u64);
    };
    match h.kind {
        Kind::Write | Kind::DurableWrite => {
            grow(bytes, len, end);
            bytes[h.offset as usize..end].copy_from_slice(&r.data);
        }
        Kind::Zeroes => {
            grow(bytes, len, end);
            bytes[h.offset as usize..end].fill(0);
        }
        Kind::Discard => {
            let end = end.min(bytes.len());
            if (h.offset as usize) < end {
                bytes[h.offset as usize..end].fill(0);
            }
        }
        Kind::Resize => {
            bytes.resize(h.offset as usize, 0);
            *len = h.offset;
        }
        Kind::Flush => {}
    }
}

/// Sorts and merges ranges.
fn merge(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The first offset below `upto` where `got` differs from `want`, outside `uncertain`.
pub fn first_difference(
    want: &[u8],
    got: &[u8],
    upto: u64,
    uncertain: &[Range<u64>],
) -> Option<u64> {
    let mut at = 0u64;
    let mut holes = uncertain.iter().peekable();
    while at < upto {
        while holes.peek().is_some_and(|h| h.end <= at) {
            holes.next();
        }
        let stop = match holes.peek() {
            Some(h) if h.start <= at => {
                at = h.end;
                continue;
            }
            Some(h) => h.start.min(upto),
            None => upto,
        };
        let (a, b) = (
            &want[at as usize..stop as usize],
            &got[at as usize..stop as usize],
        );
        // Slice equality first: a memcmp, fast even in a debug build.
        if a != b {
            let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
            return Some(at + i as u64);
        }
        at = stop;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one uncertain range is the case
    fn differences_inside_uncertain_ranges_are_allowed() {
        let want = [0u8; 16];
        let mut got = [0u8; 16];
        got[4] = 1;
        assert_eq!(first_difference(&want, &got, 16, &[3..5]), None);
        assert_eq!(first_difference(&want, &got, 16, &[5..6]), Some(4));
        assert_eq!(first_difference(&want, &got, 4, &[]), None);
        assert_eq!(merge(vec![5..6, 0..2, 1..3]), [0..3, 5..6]);
    }
}
