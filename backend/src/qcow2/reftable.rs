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

use crate::{BlockBackend, Ctx};

use super::header::REFCOUNT_TABLE_FIELD;
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
    let (pb, old_len) = (r.per_block(), r.table.len() as u64);
    let wanted = (*end / pb + 1).max(2 * old_len);
    let table_clusters = (wanted * 8).div_ceil(cs);
    let start = *end;
    // The blocks the new clusters need, which are new clusters too: iterate to a fixpoint.
    let mut blocks = 0;
    loop {
        let needed = missing_blocks(r, start, start + table_clusters + blocks).count() as u64;
        if needed == blocks {
            break;
        }
        blocks = needed;
    }
    let area = start..start + table_clusters + blocks;
    let mut table = r.table.clone(); // once per growth
    table.resize((table_clusters * cs / 8) as usize, 0);
    let new_blocks: Vec<u64> = missing_blocks(r, area.start, area.end).collect();
    for (i, &b) in new_blocks.iter().enumerate() {
        table[b as usize] = (start + table_clusters + i as u64) * cs;
    }
    // Refcounts of the area: in the new blocks, or in the existing ones.
    let mut c = area.start;
    while c < area.end {
        let b = c / pb;
        let run_end = area.end.min((b + 1) * pb);
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
    let raw: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
    host.write(cx, &raw, start * cs)?;
    host.file.flush(cx)?;
    let mut field = [0u8; 12];
    field[..8].copy_from_slice(&(start * cs).to_be_bytes());
    field[8..].copy_from_slice(&(table_clusters as u32).to_be_bytes());
    host.write(cx, &field, REFCOUNT_TABLE_FIELD)?;
    host.file.flush(cx)?;
    let old = (r.table_offset / cs)..(r.table_offset / cs + (old_len * 8).div_ceil(cs));
    (r.table, r.table_offset) = (table, start * cs);
    for c in old.clone() {
        r.set_run(cx, host, c, 1, 0, scratch)?;
    }
    *end = area.end;
    log::info!("qcow2: refcount table grown to {table_clusters} clusters");
    Ok(old)
}

/// The block indices covering clusters `[first, end)` that have no block yet.
fn missing_blocks(r: &Refcounts, first: u64, end: u64) -> impl Iterator<Item = u64> + '_ {
    let pb = r.per_block();
    (first / pb..end.div_ceil(pb)).filter(move |&b| r.block_of(b * pb).is_none())
}
