//! The references to each host cluster, counted as QEMU's `qemu-img check` counts them
//! (block/qcow2-refcount.c, `calculate_refcounts`): one per path that reaches a cluster,
//! so an L2 table that the active state and a snapshot share counts 2, and so does each
//! data cluster it maps. Pure bookkeeping, kept apart from the walk over the image
//! (`repair.rs`) so that it can be tested without one.
//!
//! Besides the count, each cluster remembers what references it, to find corruption that
//! counting alone would hide: a cluster that is both an L2 table and data, or a table that
//! another table or data overlaps. Data clusters may be shared (snapshots, and compressed
//! clusters packed into one host cluster), and L2 tables may be (snapshots); every other
//! kind of metadata is referenced once.

use std::fmt;
use std::io;
use std::ops::Range;

/// What references a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Free,
    /// Guest data: standard, preallocated zero, or compressed clusters.
    Data,
    L2,
    /// The header, L1 tables, the refcount table and blocks, the snapshot table.
    Meta,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Free => "free",
            Kind::Data => "data",
            Kind::L2 => "an L2 table",
            Kind::Meta => "metadata",
        })
    }
}

/// Why a reference cannot be counted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Clash {
    /// Cluster `0` lies past the end of the file.
    PastEnd(u64),
    /// Cluster `0`, already `1`, is referenced as `2` too.
    Overlap(u64, Kind, Kind),
    /// Cluster `0` would have more references than a refcount entry holds.
    Overflow(u64),
}

impl fmt::Display for Clash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Clash::PastEnd(c) => write!(f, "cluster {c} lies past the end of the file"),
            Clash::Overlap(c, old, new) => write!(f, "cluster {c} is both {old} and {new}"),
            Clash::Overflow(c) => write!(
                f,
                "cluster {c} has more references than the image's refcounts hold \
                 (qemu-img amend -o refcount_bits can widen them)"
            ),
        }
    }
}

/// References per host cluster of a file of `len()` clusters.
pub(crate) struct Tally {
    refs: Vec<u32>,
    kinds: Vec<Kind>,
    /// The largest refcount the image's entries hold.
    max: u64,
}

impl Tally {
    /// No references yet, for `clusters` clusters and refcounts up to `max`; an error
    /// where memory for them cannot be had (a hostile file, sparse and huge), as QEMU's
    /// check fails with ENOMEM, rather than an abort.
    pub(crate) fn new(clusters: u64, max: u64) -> io::Result<Tally> {
        let mut t = Tally {
            refs: Vec::new(),
            kinds: Vec::new(),
            max: max.min(u32::MAX as u64),
        };
        t.grow(clusters)?;
        Ok(t)
    }

    /// Clusters covered.
    pub(crate) fn len(&self) -> u64 {
        self.refs.len() as u64
    }

    /// Covers `clusters` clusters (more than before: a rebuilt refcount structure at the
    /// end of the file).
    pub(crate) fn grow(&mut self, clusters: u64) -> io::Result<()> {
        let more = usize::try_from(clusters)
            .ok()
            .and_then(|n| n.checked_sub(self.refs.len()))
            .ok_or(io::ErrorKind::OutOfMemory)?;
        self.refs.try_reserve_exact(more).map_err(|_| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("no memory to count the references of {clusters} clusters"),
            )
        })?;
        self.kinds
            .try_reserve_exact(more)
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        self.refs.resize(clusters as usize, 0);
        self.kinds.resize(clusters as usize, Kind::Free);
        Ok(())
    }

    /// References of cluster `c` (0 past the end).
    pub(crate) fn get(&self, c: u64) -> u64 {
        self.refs.get(c as usize).map_or(0, |&n| n as u64)
    }

    /// Adds one reference as `kind` to each cluster of `range`; on a clash, nothing.
    pub(crate) fn add(&mut self, range: Range<u64>, kind: Kind) -> Result<(), Clash> {
        for c in range.clone() {
            let Some(&old) = self.kinds.get(c as usize) else {
                return Err(Clash::PastEnd(c));
            };
            let shared = old == kind && matches!(kind, Kind::Data | Kind::L2);
            if old != Kind::Free && !shared {
                return Err(Clash::Overlap(c, old, kind));
            }
            if self.refs[c as usize] as u64 >= self.max {
                return Err(Clash::Overflow(c));
            }
        }
        for c in range {
            self.refs[c as usize] += 1;
            self.kinds[c as usize] = kind;
        }
        Ok(())
    }

    /// Takes back one reference of each cluster of `range` (added before).
    pub(crate) fn remove(&mut self, range: Range<u64>) {
        for c in range {
            let n = &mut self.refs[c as usize];
            *n -= 1;
            if *n == 0 {
                self.kinds[c as usize] = Kind::Free;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_tables_and_data_count_once_per_path() {
        let mut t = Tally::new(8, 0xffff).unwrap();
        t.add(0..1, Kind::Meta).unwrap(); // header
        t.add(3..4, Kind::L2).unwrap(); // active L1 -> table 3
        t.add(3..4, Kind::L2).unwrap(); // snapshot L1 -> table 3
        for _ in 0..2 {
            t.add(5..6, Kind::Data).unwrap(); // its entry, reached twice
        }
        t.add(6..8, Kind::Data).unwrap(); // compressed bytes crossing two clusters
        t.add(7..8, Kind::Data).unwrap(); // another packed into the second
        let got: Vec<u64> = (0..8).map(|c| t.get(c)).collect();
        assert_eq!(got, [1, 0, 0, 2, 0, 2, 1, 2]);
    }

    #[test]
    fn clashes_are_corruption() {
        let mut t = Tally::new(4, 0xffff).unwrap();
        t.add(0..1, Kind::Meta).unwrap();
        t.add(2..3, Kind::L2).unwrap();
        assert_eq!(
            t.add(2..3, Kind::Data),
            Err(Clash::Overlap(2, Kind::L2, Kind::Data))
        );
        assert_eq!(
            t.add(1..3, Kind::Data),
            Err(Clash::Overlap(2, Kind::L2, Kind::Data))
        );
        assert_eq!(t.get(1), 0, "a refused range adds nothing");
        assert_eq!(
            t.add(0..1, Kind::Meta),
            Err(Clash::Overlap(0, Kind::Meta, Kind::Meta))
        );
        assert_eq!(t.add(3..5, Kind::Data), Err(Clash::PastEnd(4)));
        let mut one_bit = Tally::new(4, 1).unwrap();
        one_bit.add(1..2, Kind::Data).unwrap();
        assert_eq!(one_bit.add(1..2, Kind::Data), Err(Clash::Overflow(1)));
    }

    #[test]
    fn remove_undoes_add() {
        let mut t = Tally::new(4, 0xffff).unwrap();
        t.add(1..3, Kind::Meta).unwrap();
        t.remove(1..3);
        t.add(1..2, Kind::Data).unwrap();
        assert_eq!((t.get(1), t.get(2)), (1, 0));
    }
}
