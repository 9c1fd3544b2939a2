//! Repairing a dirty image when it is opened for writing, as QEMU does at open
//! (block/qcow2.c `qcow2_do_open`, then `qcow2_check_refcounts` of block/qcow2-refcount.c
//! with errors and leaks fixed). Why at open, and why here: the DIRTY bit says the
//! refcounts were not all written back (QEMU with `lazy_refcounts=on`, or corofuse, which
//! keeps the bit set while it serves so that a kill leaves its reservation of leaked
//! clusters to be reclaimed here); writing into such an image could hand out a cluster
//! still in use, and corofuse writes in place into clusters whose entry has COPIED.
//!
//! 1. Count what references each cluster ([`Tally`]): the header, the active L1 table,
//!    each snapshot's L1 table, the L2 tables they point to and the data clusters those
//!    map, once per path, and the snapshot table. A reference past the end of the file,
//!    not aligned, or to a cluster that is also other metadata (or both an L2 table and
//!    data), or more references than a refcount holds, is corruption: the open is
//!    refused with the reason, and nothing has been written.
//! 2. Count the refcount table and blocks. Where they are usable (inside the file,
//!    aligned, overlapping nothing) and a block covers every referenced cluster, each
//!    block that differs from the count is rewritten; otherwise the whole refcount
//!    structure is rebuilt past the end of the file (`rebuild.rs`).
//! 3. Make OFLAG_COPIED of the active L1 and L2 entries say "refcount 1" exactly.
//! 4. Sync, then punch the host space of the leaked clusters (refcount above 0, referenced
//!    by nothing): what a killed writer had reserved.
//!
//! The DIRTY bit stays set through all of it (the caller clears it only at a clean
//! close): the count depends on the tables alone, never on the refcounts being fixed, so a
//! kill mid-repair leaves an image that the next open repairs again. One log line says
//! what was repaired.

use std::io;
use std::ops::Range;
use std::path::Path;

use crate::Ctx;

use super::entry::{Mapping, COPIED, OFFSET_MASK};
use super::header::Header;
use super::hostio::Host;
use super::rebuild;
use super::refcount::Refcounts;
use super::snapshot::Snapshot;
use super::tally::{Clash, Kind, Tally};

/// What a repair changed.
#[derive(Default, Debug)]
struct Repaired {
    /// Refcounts set to the count of their references (above 0).
    corrected: u64,
    /// Refcounts set to 0: clusters nothing references.
    leaked: u64,
    /// Runs of leaked clusters inside the file, to punch: (first, count).
    leaks: Vec<(u64, u64)>,
    /// L1 and L2 entries whose COPIED bit was wrong.
    copied: u64,
    /// The refcount structure was unusable and made anew.
    rebuilt: bool,
}

impl Repaired {
    fn leak(&mut self, c: u64, in_file: bool) {
        self.leaked += 1;
        if !in_file || c == 0 {
            return;
        }
        match self.leaks.last_mut() {
            Some((first, n)) if *first + *n == c => *n += 1,
            _ => self.leaks.push((c, 1)),
        }
    }
}

/// An error for an image whose tables contradict each other.
fn corrupt(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "qcow2 image is corrupt, not only dirty: {why} (qemu-img check -r all may repair it)"
        ),
    )
}

/// Repairs the dirty image with header `h` (whose refcount table fields change if the
/// structure is rebuilt), snapshots `snapshots` and a snapshot table of `snapshot_bytes`.
/// `before_writing` runs once the image is known not to be corrupt, before the first
/// write (the caller clears the autoclear bits there: a refused image stays unchanged).
pub(crate) fn repair(
    cx: &Ctx<'_>,
    host: &Host,
    h: &mut Header,
    snapshots: &[Snapshot],
    snapshot_bytes: u64,
    path: &Path,
    before_writing: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<()> {
    let geometry = Refcounts::with_table(h, 0, Vec::new());
    let mut t = Tally::new(host.file.len().div_ceil(h.cluster_size()), geometry.max())?;
    count_image(cx, host, h, snapshots, snapshot_bytes, &mut t)?;
    let old = Refcounts::load(cx, host, h).ok();
    let usable = match &old {
        Some(r) => match count_refcounts(&mut t, r, h)? {
            Some(_) if covers(r, &t) => true,
            Some(counted) => {
                // Rebuilt: the old table and blocks are referenced by nothing afterwards.
                counted.into_iter().for_each(|range| t.remove(range));
                false
            }
            None => false,
        },
        None => false,
    };
    before_writing()?;
    let mut done = Repaired::default();
    if let Some(r) = &old {
        fix_refcounts(cx, host, h, r, &t, &mut done, usable)?;
    }
    if !usable {
        rebuild::rebuild(cx, host, h, &mut t)?;
        done.rebuilt = true;
    }
    fix_copied(cx, host, h, &t, &mut done)?;
    host.file.flush(cx)?;
    let cs = h.cluster_size();
    for &(first, n) in &done.leaks {
        if let Err(e) = host.file.discard(cx, first * cs, n * cs) {
            log::debug!("punching {n} leaked clusters at {:#x}: {e}", first * cs);
        }
    }
    let bytes: u64 = done.leaks.iter().map(|&(_, n)| n * cs).sum();
    log::warn!(
        "qcow2 {}: was dirty: {} refcounts corrected, {} leaked clusters ({:.1} MiB) reclaimed, \
         {} COPIED flags fixed{}",
        path.display(),
        done.corrected,
        done.leaked,
        bytes as f64 / (1 << 20) as f64,
        done.copied,
        if done.rebuilt {
            ", refcount structure rebuilt"
        } else {
            ""
        },
    );
    Ok(())
}

/// Host clusters `[at, at + len)` touches (a hostile `at` saturates: past the end).
fn clusters(h: &Header, at: u64, len: u64) -> Range<u64> {
    (at >> h.cluster_bits)..at.saturating_add(len).div_ceil(h.cluster_size())
}

/// Adds a reference, or says what clashed as corruption.
fn add(t: &mut Tally, r: Range<u64>, kind: Kind, what: impl Fn() -> String) -> io::Result<()> {
    t.add(r, kind)
        .map_err(|clash| corrupt(format_args!("{}: {clash}", what())))
}

/// Counts every reference but the refcount structure's own.
pub(crate) fn count_image(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    snapshots: &[Snapshot],
    snapshot_bytes: u64,
    t: &mut Tally,
) -> io::Result<()> {
    add(t, 0..1, Kind::Meta, || "the header".into())?;
    let active = (h.l1_table_offset, h.l1_size);
    count_l1(cx, host, h, t, active, &|| "the active L1 table".into())?;
    for s in snapshots {
        let what = || format!("the L1 table of snapshot {}", s.id);
        count_l1(cx, host, h, t, (s.l1_table_offset, s.l1_size), &what)?;
    }
    let table = clusters(h, h.snapshots_offset, snapshot_bytes);
    add(t, table, Kind::Meta, || "the snapshot table".into())
}

/// Counts the L1 table `(offset, entries)`, its L2 tables and their data clusters.
fn count_l1(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    t: &mut Tally,
    (offset, entries): (u64, u32),
    what: &dyn Fn() -> String,
) -> io::Result<()> {
    let len = entries as u64 * 8;
    add(t, clusters(h, offset, len), Kind::Meta, what)?;
    let mut raw = vec![0u8; len as usize]; // once per L1 table, at open
    host.read_exact(cx, &mut raw, offset)?;
    count_l2_tables(cx, host, h, t, &raw, what)
}

/// Counts the L2 tables that the L1 entries `raw` name and their data clusters (not the
/// L1 table's own clusters).
pub(crate) fn count_l2_tables(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    t: &mut Tally,
    raw: &[u8],
    what: &dyn Fn() -> String,
) -> io::Result<()> {
    let mut l2 = vec![0u8; h.cluster_size() as usize];
    for (i, e) in raw.chunks_exact(8).enumerate() {
        let table = be64(e) & OFFSET_MASK;
        if table == 0 {
            continue;
        }
        let at = || format!("{}, entry {i}: L2 table at {table:#x}", what());
        if table % h.cluster_size() != 0 {
            return Err(corrupt(format_args!("{}: not aligned to a cluster", at())));
        }
        add(t, clusters(h, table, 1), Kind::L2, at)?;
        host.read_exact(cx, &mut l2, table)?;
        count_l2(h, t, &l2, &at)?;
    }
    Ok(())
}

/// Counts the data clusters the L2 table `raw` maps.
fn count_l2(h: &Header, t: &mut Tally, raw: &[u8], what: &dyn Fn() -> String) -> io::Result<()> {
    for (j, e) in raw.chunks_exact(8).enumerate() {
        let m = Mapping::decode(be64(e), h.cluster_bits);
        let at = || format!("{}, entry {j}: {m:x?}", what());
        if let Mapping::Data { host, .. } | Mapping::Zero { host } = m {
            if host % h.cluster_size() != 0 {
                return Err(corrupt(format_args!("{}: not aligned to a cluster", at())));
            }
        }
        let r = m.host_clusters(h.cluster_bits);
        if !r.is_empty() {
            add(t, r, Kind::Data, at)?;
        }
    }
    Ok(())
}

/// Counts the refcount table and blocks of `r` if they are usable (inside the file and
/// aligned), returning the ranges counted: `Ok(None)`, counting nothing, if not. One that
/// overlaps another counted cluster is corruption: which of the two is wrong cannot be
/// told.
fn count_refcounts(
    t: &mut Tally,
    r: &Refcounts,
    h: &Header,
) -> io::Result<Option<Vec<Range<u64>>>> {
    let table = clusters(h, r.table_offset, r.table.len() as u64 * 8);
    let blocks = r.table.iter().filter(|&&b| b != 0);
    if blocks.clone().any(|&b| b % h.cluster_size() != 0) {
        return Ok(None);
    }
    let all = std::iter::once(table).chain(blocks.map(|&b| clusters(h, b, 1)));
    let mut added = Vec::new();
    for range in all {
        match t.add(range.clone(), Kind::Meta) {
            Ok(()) => added.push(range),
            Err(clash) => {
                added.into_iter().for_each(|r| t.remove(r));
                return match clash {
                    Clash::PastEnd(_) => Ok(None),
                    clash => Err(corrupt(format_args!("the refcount structure: {clash}"))),
                };
            }
        }
    }
    Ok(Some(added))
}

/// Whether a refcount block covers every referenced cluster.
fn covers(r: &Refcounts, t: &Tally) -> bool {
    (0..t.len()).all(|c| t.get(c) == 0 || r.block_of(c).is_some())
}

/// Compares each refcount block of `r` with the count, noting what differs in `done`, and
/// with `write` rewrites the blocks that differ (blocks that cannot be read are skipped:
/// they are only compared, for an unusable structure about to be rebuilt).
fn fix_refcounts(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    r: &Refcounts,
    t: &Tally,
    done: &mut Repaired,
    write: bool,
) -> io::Result<()> {
    let cs = h.cluster_size();
    let mut raw = vec![0u8; cs as usize];
    for (bi, &block) in r.table.iter().enumerate() {
        if block == 0 || block % cs != 0 || block + cs > host.file.len() {
            continue; // none, or unusable (and so `write` is false)
        }
        host.read_exact(cx, &mut raw, block)?;
        let mut changed = false;
        for i in 0..r.per_block() {
            let c = bi as u64 * r.per_block() + i;
            let (have, want) = (r.get_in(&raw, 0, i), t.get(c));
            if have == want {
                continue;
            }
            match want {
                0 => done.leak(c, c < t.len()),
                _ => done.corrected += 1,
            }
            r.set_in(&mut raw, 0, i, want);
            changed = true;
        }
        if write && changed {
            host.write(cx, &raw, block)?;
        }
    }
    Ok(())
}

/// Sets COPIED on the active L1 and L2 entries whose cluster has refcount 1 (the count),
/// and clears it on the others.
fn fix_copied(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    t: &Tally,
    done: &mut Repaired,
) -> io::Result<()> {
    let mut l1 = vec![0u8; h.l1_size as usize * 8]; // once, at open
    host.read_exact(cx, &mut l1, h.l1_table_offset)?;
    let mut l2 = vec![0u8; h.cluster_size() as usize];
    let owned = |host: u64| t.get(host >> h.cluster_bits) == 1;
    let mut l1_changed = false;
    for e in l1.chunks_exact_mut(8) {
        let table = be64(e) & OFFSET_MASK;
        if table == 0 {
            continue;
        }
        l1_changed |= set_copied(e, owned(table), done);
        host.read_exact(cx, &mut l2, table)?;
        let mut changed = false;
        for e in l2.chunks_exact_mut(8) {
            if let Mapping::Data { host, .. } | Mapping::Zero { host } =
                Mapping::decode(be64(e), h.cluster_bits)
            {
                if host != 0 {
                    changed |= set_copied(e, owned(host), done);
                }
            }
        }
        if changed {
            host.write(cx, &l2, table)?;
        }
    }
    if l1_changed {
        host.write(cx, &l1, h.l1_table_offset)?;
    }
    Ok(())
}

/// Makes the COPIED bit of entry `e` say `owned`; whether it changed.
fn set_copied(e: &mut [u8], owned: bool, done: &mut Repaired) -> bool {
    let v = be64(e);
    if (v & COPIED != 0) == owned {
        return false;
    }
    e.copy_from_slice(&(v ^ COPIED).to_be_bytes());
    done.copied += 1;
    true
}

fn be64(e: &[u8]) -> u64 {
    u64::from_be_bytes(e.try_into().expect("8 bytes"))
}
