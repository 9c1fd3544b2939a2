//! Refcounts: how many references each host cluster has (docs/interop/qcow2.txt, "Host
//! cluster management"): a refcount table (contiguous, `refcount_table_clusters` long) of
//! refcount block offsets, each block one cluster of `refcount_bits`-wide entries.
//!
//! Entries are read and written on disk one run at a time, never cached: only the
//! allocator (which serializes itself, `alloc.rs`) touches them, and it batches. Entries
//! narrower than a byte pack from the least significant bit, as the spec says.

use std::io;

use crate::Ctx;

use super::header::Header;
use super::hostio::Host;

/// The geometry of an image's refcounts, and its table (read at open).
pub(crate) struct Refcounts {
    pub(crate) table_offset: u64,
    /// Block offsets (0: no block yet), one per table entry.
    pub(crate) table: Vec<u64>,
    /// log2 of the entry width in bits.
    order: u32,
    cluster_bits: u32,
}

impl Refcounts {
    /// Reads the refcount table.
    pub(crate) fn load(cx: &Ctx<'_>, host: &Host, h: &Header) -> io::Result<Refcounts> {
        let mut raw = vec![0u8; (h.refcount_table_clusters as usize) << h.cluster_bits];
        host.read_exact(cx, &mut raw, h.refcount_table_offset)?;
        let table = raw
            .chunks_exact(8)
            .map(|e| u64::from_be_bytes(e.try_into().expect("8 bytes")) & !511)
            .collect();
        Ok(Refcounts::with_table(h, h.refcount_table_offset, table))
    }

    /// The refcounts of an image with header `h` whose table, at `table_offset`, holds
    /// `table`.
    pub(crate) fn with_table(h: &Header, table_offset: u64, table: Vec<u64>) -> Refcounts {
        Refcounts {
            table_offset,
            table,
            order: h.refcount_order,
            cluster_bits: h.cluster_bits,
        }
    }

    /// Refcount entries per block.
    pub(crate) fn per_block(&self) -> u64 {
        (1u64 << (self.cluster_bits + 3)) >> self.order
    }

    fn bits(&self) -> u32 {
        1 << self.order
    }

    /// The largest refcount an entry holds.
    pub(crate) fn max(&self) -> u64 {
        u64::MAX >> (64 - self.bits())
    }

    /// The block holding the refcount of `cluster`, if it exists (`None` also past the
    /// table's end).
    pub(crate) fn block_of(&self, cluster: u64) -> Option<u64> {
        let at = (cluster / self.per_block()) as usize;
        self.table.get(at).copied().filter(|&b| b != 0)
    }

    /// The bytes of a block that hold entries `[first, first + count)`.
    fn byte_span(&self, first: u64, count: u64) -> (u64, u64) {
        let start = (first << self.order) / 8;
        let end = ((first + count) << self.order).div_ceil(8);
        (start, end)
    }

    /// Entry `i` of a block's bytes `raw` that start at entry-byte `base`.
    pub(crate) fn get_in(&self, raw: &[u8], base: u64, i: u64) -> u64 {
        let bit = i << self.order;
        let byte = (bit / 8 - base) as usize;
        match self.bits() {
            b if b < 8 => (raw[byte] as u64 >> (bit % 8)) & self.max(),
            b => raw[byte..byte + b as usize / 8]
                .iter()
                .fold(0, |v, &x| (v << 8) | x as u64),
        }
    }

    /// Sets entry `i` of `raw` (bytes from entry-byte `base` on) to `value`.
    pub(crate) fn set_in(&self, raw: &mut [u8], base: u64, i: u64, value: u64) {
        let bit = i << self.order;
        let byte = (bit / 8 - base) as usize;
        match self.bits() {
            b if b < 8 => {
                let shift = bit % 8;
                let mask = (self.max() as u8) << shift;
                raw[byte] = (raw[byte] & !mask) | ((value as u8) << shift & mask);
            }
            b => {
                let n = b as usize / 8;
                raw[byte..byte + n].copy_from_slice(&value.to_be_bytes()[8 - n..]);
            }
        }
    }

    /// The refcount of `cluster` (0 where no block covers it).
    pub(crate) fn get(&self, cx: &Ctx<'_>, host: &Host, cluster: u64) -> io::Result<u64> {
        let Some(block) = self.block_of(cluster) else {
            return Ok(0);
        };
        let i = cluster % self.per_block();
        let (start, end) = self.byte_span(i, 1);
        let mut raw = [0u8; 8];
        let raw = &mut raw[..(end - start) as usize];
        host.read_exact(cx, raw, block + start)?;
        Ok(self.get_in(raw, start, i))
    }

    /// Sets the refcounts of clusters `[first, first + count)`, all covered by one existing
    /// block, to `value`, with `scratch` (at least a cluster) for the block's bytes.
    pub(crate) fn set_run(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        first: u64,
        count: u64,
        value: u64,
        scratch: &mut [u8],
    ) -> io::Result<()> {
        self.set_run_as(cx, host, first, count, value, scratch, false)
    }

    /// As [`Refcounts::set_run`], the write durable on return (`RWF_DSYNC`, not an
    /// `fdatasync` of the whole image).
    pub(crate) fn set_run_durable(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        first: u64,
        count: u64,
        value: u64,
        scratch: &mut [u8],
    ) -> io::Result<()> {
        self.set_run_as(cx, host, first, count, value, scratch, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn set_run_as(
        &self,
        cx: &Ctx<'_>,
        host: &Host,
        first: u64,
        count: u64,
        value: u64,
        scratch: &mut [u8],
        durable: bool,
    ) -> io::Result<()> {
        let block = self
            .block_of(first)
            .expect("the caller made the refcount block");
        let i = first % self.per_block();
        debug_assert!(i + count <= self.per_block());
        let (start, end) = self.byte_span(i, count);
        let raw = &mut scratch[..(end - start) as usize];
        if self.bits() < 8 {
            host.read_exact(cx, raw, block + start)?; // neighbours share the bytes
        }
        for k in i..i + count {
            self.set_in(raw, start, k, value);
        }
        match durable {
            true => host.write_durable(cx, raw, block + start),
            false => host.write(cx, raw, block + start),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(order: u32) -> Refcounts {
        Refcounts {
            table_offset: 0,
            table: vec![],
            order,
            cluster_bits: 9,
        }
    }

    #[test]
    fn entries_of_every_width_round_trip() {
        for order in 0..=6 {
            let r = geometry(order);
            let mut raw = vec![0u8; 512];
            let last = r.per_block() - 1;
            r.set_in(&mut raw, 0, 3, 1);
            r.set_in(&mut raw, 0, last, r.max());
            assert_eq!(
                (r.get_in(&raw, 0, 3), r.get_in(&raw, 0, 2)),
                (1, 0),
                "order {order}"
            );
            assert_eq!(r.get_in(&raw, 0, last), r.max(), "order {order}");
        }
        // 1-bit refcounts: entry 3 is bit 3 of byte 0, from the least significant bit.
        let r = geometry(0);
        let mut raw = [0u8; 1];
        r.set_in(&mut raw, 0, 3, 1);
        assert_eq!(raw, [0b1000]);
        // 16-bit refcounts are big-endian.
        let r = geometry(4);
        let mut raw = [0u8; 4];
        r.set_in(&mut raw, 0, 1, 0x0102);
        assert_eq!(raw, [0, 0, 1, 2]);
    }
}
