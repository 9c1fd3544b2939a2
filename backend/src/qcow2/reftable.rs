//! Growing the refcount table, when the file reaches past what its refcount blocks can
//! cover (a table of one cluster covers 8 MiB of file with 512-byte clusters, 4 GiB with
//! 4 KiB ones).
//!
//! The new table (twice the entries at least) goes at the end of the file, followed by the
//! refcount blocks that the new clusters themselves need, all counted in those blocks (or
//! in existing ones) before anything points to them. Order: blocks and table written,
//! `fdatasync`, then one 12-byte header write switches `refcount_table_offset` and
//! `refcount_table_clusters` together, `fdatasync`, and only then the old table's
//! clusters are freed. A kill before the switch leaves the old table in force and the new
//! clusters leaked; after it, the old table's clusters leaked until freed.

use std::io;

use crate::Ctx;

use super::header::{MAX_REFTABLE_BYTES, REFCOUNT_TABLE_FIELD};
use super::hostio::Host;
use super::refcount::Refcounts;

/// Grows `r`'s table so that it has an entry for the block covering cluster `end`, placing
/// the new clusters from `*end` on (and moving `*end` past them). Returns the old table's
/// clusters, now free, as a range of cluster indices.
pub(crate) fn grow(
    cx: &Ctx<'_>,
    host: &Host,
    r: &mut Refcounts,
    end: &mut u64,
    scratch: &mut [u8],
) -> io::Result<std::ops::Range<u64>> {
    let cs = scratch.len() as u64;
    let old_len = r.table.len() as u64;
    // No larger than QEMU opens (nor corofuse: `header.rs`).
    let max_entries = MAX_REFTABLE_BYTES / 8;
    let needed = *end / r.per_block() + 1;
    if needed > max_entries {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    let wanted = needed.max(2 * old_len).min(max_entries);
    let table_clusters = (wanted * 8).div_ceil(cs);
    let start = *end;
    let mut table = r.table.clone(); // once per growth
    table.resize((table_clusters * cs / 8) as usize, 0);
    let (area_end, _) = claim(cx, host, r, &mut table, start, table_clusters, scratch)?;
    install(cx, host, &table, start * cs, table_clusters)?;
    let old = (r.table_offset / cs)..(r.table_offset / cs + (old_len * 8).div_ceil(cs));
    (r.table, r.table_offset) = (table, start * cs);
    for c in old.clone() {
        r.set_run(cx, host, c, 1, 0, scratch)?;
    }
    *end = area_end;
    log::info!("qcow2: refcount table grown to {table_clusters} clusters");
    Ok(old)
}

/// Writes `table` (`clusters` clusters) at host offset `at`, syncs, then switches the
/// header's `refcount_table_offset` and `refcount_table_clusters` to it in one 12-byte
/// write, and syncs: the refcounts the table points to must be written already. A kill
/// before the switch leaves the old table in force.
pub(crate) fn install(
    cx: &Ctx<'_>,
    host: &Host,
    table: &[u64],
    at: u64,
    clusters: u64,
) -> io::Result<()> {
    let raw: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
    host.write(cx, &raw, at)?;
    host.file.flush(cx)?;
    let mut field = [0u8; 12];
    field[..8].copy_from_slice(&at.to_be_bytes());
    field[8..].copy_from_slice(&(clusters as u32).to_be_bytes());
    host.write(cx, &field, REFCOUNT_TABLE_FIELD)?;
    host.file.flush(cx)
}

/// The first cluster past `[start, start + n)` and the refcount blocks it needs (placed
/// right after it), where `table` is the refcount table to be.
pub(crate) fn area_end(r: &Refcounts, table: &[u64], start: u64, n: u64) -> u64 {
    let mut blocks = 0;
    loop {
        let needed = missing_blocks(r, table, start, start + n + blocks).count() as u64;
        if needed == blocks {
            return start + n + blocks;
        }
        blocks = needed;
    }
}

/// Counts clusters `[start, start + n)` (refcount 1), and the refcount blocks they need,
/// made right after them and entered in `table` (the refcount table to be, which must
/// reach that far). Existing blocks get their entries written; new blocks are written
/// whole. Returns the end of the area and the indices of the new blocks (the caller writes
/// their table entries, after a sync).
pub(crate) fn claim(
    cx: &Ctx<'_>,
    host: &Host,
    r: &Refcounts,
    table: &mut [u64],
    start: u64,
    n: u64,
    scratch: &mut [u8],
) -> io::Result<(u64, Vec<u64>)> {
    let (cs, pb) = (scratch.len() as u64, r.per_block());
    let end = area_end(r, table, start, n);
    let new_blocks: Vec<u64> = missing_blocks(r, table, start, end).collect();
    if new_blocks
        .last()
        .is_some_and(|&b| b as usize >= table.len())
    {
        return Err(io::Error::from_raw_os_error(libc::ENOSPC)); // the caller grows first
    }
    for (i, &b) in new_blocks.iter().enumerate() {
        table[b as usize] = (start + n + i as u64) * cs;
    }
    let mut c = start;
    while c < end {
        let b = c / pb;
        let run_end = end.min((b + 1) * pb);
        match r.block_of(c) {
            Some(_) => r.set_run(cx, host, c, run_end - c, 1, scratch)?,
            None => {
                scratch.fill(0);
                for k in c..run_end {
                    r.set_in(scratch, 0, k % pb, 1);
                }
                host.write(cx, scratch, table[b as usize])?;
            }
        }
        c = run_end;
    }
    Ok((end, new_blocks))
}

/// The block indices covering clusters `[first, end)` that have no block in `table`.
fn missing_blocks<'a>(
    r: &Refcounts,
    table: &'a [u64],
    first: u64,
    end: u64,
) -> impl Iterator<Item = u64> + 'a {
    let pb = r.per_block();
    (first / pb..end.div_ceil(pb)).filter(move |&b| table.get(b as usize).is_none_or(|&o| o == 0))
}
