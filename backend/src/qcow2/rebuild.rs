//! A new refcount structure for a dirty image whose own cannot be fixed in place (a table
//! or block outside the file, not aligned or overlapping other clusters, or a referenced
//! cluster no block covers), as QEMU's `rebuild_refcount_structure` makes one.
//!
//! The new table and its blocks go past the end of the file, where nothing is referenced,
//! each block covering its share of the clusters (the new ones included) with the counts
//! of the repair (`repair.rs`). Order: blocks and table written, `fdatasync`, then one
//! 12-byte header write switches `refcount_table_offset` and `refcount_table_clusters`
//! together (as `reftable.rs` grows a table), `fdatasync`. A kill before the switch leaves
//! the old structure in force and the image dirty: the next open repairs it again. The old
//! table and blocks are counted by nothing afterwards, so the repair's leaked clusters
//! include them.

use std::io;

use crate::Ctx;

use super::header::{Header, MAX_REFTABLE_BYTES};
use super::hostio::Host;
use super::refcount::Refcounts;
use super::tally::{Kind, Tally};

/// Writes a refcount structure holding the counts of `t` after the end of the file, and
/// switches the header (and `h`) to it.
pub(crate) fn rebuild(cx: &Ctx<'_>, host: &Host, h: &mut Header, t: &mut Tally) -> io::Result<()> {
    let r = write_blocks(cx, host, h, t)?;
    let table_clusters = r.table.len() as u64 * 8 / h.cluster_size();
    super::reftable::install(cx, host, &r.table, r.table_offset, table_clusters)?;
    (h.refcount_table_offset, h.refcount_table_clusters) = (r.table_offset, table_clusters as u32);
    Ok(())
}

/// Lays out a refcount structure holding the counts of `t` (itself counted) after the end
/// of the file (extended over it) and writes its blocks; returns it, its table not
/// written yet, nothing synced.
pub(crate) fn write_blocks(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    t: &mut Tally,
) -> io::Result<Refcounts> {
    let cs = h.cluster_size();
    let start = t.len();
    let (table_clusters, blocks) = layout(start, cs, per_block(h));
    if table_clusters * cs > MAX_REFTABLE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "qcow2 image too large for a refcount table of 8 MiB (QEMU's limit)",
        ));
    }
    let end = start + table_clusters + blocks;
    t.grow(end)?;
    t.add(start..end, Kind::Meta)
        .expect("nothing references clusters past the end of the file");
    let first_block = start + table_clusters;
    let mut table: Vec<u64> = (0..blocks).map(|b| (first_block + b) * cs).collect();
    table.resize((table_clusters * cs / 8) as usize, 0);
    let r = Refcounts::with_table(h, start * cs, table);
    host.file.resize(cx, end * cs)?;
    let mut raw = vec![0u8; cs as usize]; // once per rebuild
    for b in 0..blocks {
        raw.fill(0);
        for i in 0..r.per_block() {
            let n = t.get(b * r.per_block() + i);
            if n != 0 {
                r.set_in(&mut raw, 0, i, n);
            }
        }
        host.write(cx, &raw, (first_block + b) * cs)?;
    }
    Ok(r)
}

/// Refcount entries per block of the image with header `h`.
fn per_block(h: &Header) -> u64 {
    Refcounts::with_table(h, 0, Vec::new()).per_block()
}

/// (table clusters, blocks) for a structure placed at cluster `start` whose blocks cover
/// every cluster up to its own end.
fn layout(start: u64, cs: u64, per_block: u64) -> (u64, u64) {
    let (mut table_clusters, mut blocks) = (1, 0);
    loop {
        let end = start + table_clusters + blocks;
        let need = end.div_ceil(per_block);
        let need_table = (need * 8).div_ceil(cs);
        if (need_table, need) == (table_clusters, blocks) {
            return (table_clusters, blocks);
        }
        (table_clusters, blocks) = (need_table.max(table_clusters), need.max(blocks));
    }
}

#[cfg(test)]
mod tests {
    use super::layout;

    #[test]
    fn the_blocks_cover_themselves() {
        // 512-byte clusters, 16-bit refcounts: 256 per block, 64 table entries a cluster.
        assert_eq!(layout(10, 512, 256), (1, 1));
        assert_eq!(layout(254, 512, 256), (1, 1)); // 254, 255: table, block
        assert_eq!(layout(255, 512, 256), (1, 2)); // the block itself needs a second
        let (tc, b) = layout(100_000, 512, 256);
        assert!(b * 256 >= 100_000 + tc + b && tc * 64 >= b, "{tc} {b}");
    }
}
