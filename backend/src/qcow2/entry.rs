//! L1 and L2 table entries: what a guest cluster maps to (docs/interop/qcow2.txt, "Cluster
//! mapping"), decoded from and encoded to the 64-bit big-endian words on disk.

/// Bit 63: the cluster (or L2 table) has refcount exactly 1, so it may be written in place.
pub(crate) const COPIED: u64 = 1 << 63;
/// Bit 62 of an L2 entry: a compressed cluster.
const COMPRESSED: u64 = 1 << 62;
/// Bit 0 of a standard L2 entry (v3): the cluster reads as zeroes.
pub(crate) const ZERO: u64 = 1;
/// Bits 9-55: a cluster-aligned host offset (standard L2 entries and L1 entries).
pub(crate) const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// What one guest cluster maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// Not in the image: the backing file's bytes, or zeroes.
    Unallocated,
    /// Reads as zeroes; `host` is a preallocated cluster kept for later writes (or 0).
    Zero { host: u64 },
    /// Stored at `host`; `copied`: refcount 1, writable in place.
    Data { host: u64, copied: bool },
    /// `len` bytes of compressed data at `host` (not aligned; may cross host clusters).
    Compressed { host: u64, len: u64 },
}

impl Mapping {
    /// Decodes an L2 entry of an image with `cluster_bits`.
    pub(crate) fn decode(entry: u64, cluster_bits: u32) -> Mapping {
        if entry & COMPRESSED != 0 {
            // x = 62 - (cluster_bits - 8): the offset below bit x, extra sectors above.
            let x = 62 - (cluster_bits - 8);
            let host = entry & ((1 << x) - 1);
            let sectors = (entry >> x) & ((1 << (cluster_bits - 8)) - 1);
            let len = (sectors + 1) * 512 - (host & 511);
            return Mapping::Compressed { host, len };
        }
        let host = entry & OFFSET_MASK;
        if entry & ZERO != 0 {
            Mapping::Zero { host }
        } else if host == 0 {
            Mapping::Unallocated
        } else {
            Mapping::Data {
                host,
                copied: entry & COPIED != 0,
            }
        }
    }

    /// The L2 entry of a cluster this process wrote at `host`.
    pub(crate) fn data_entry(host: u64) -> u64 {
        host | COPIED
    }

    /// The host clusters whose refcount this mapping holds one of (none, one, or the
    /// clusters that compressed data crosses), as a range of cluster indices.
    pub(crate) fn host_clusters(&self, cluster_bits: u32) -> std::ops::Range<u64> {
        match *self {
            Mapping::Data { host, .. } | Mapping::Zero { host } if host != 0 => {
                let c = host >> cluster_bits;
                c..c + 1
            }
            Mapping::Compressed { host, len } => {
                (host >> cluster_bits)..((host + len - 1) >> cluster_bits) + 1
            }
            _ => 0..0,
        }
    }
}

/// The L2 table an L1 entry points to, or `None` if unallocated.
pub(crate) fn l2_table(l1_entry: u64) -> Option<u64> {
    Some(l1_entry & OFFSET_MASK).filter(|&o| o != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_kind() {
        assert_eq!(Mapping::decode(0, 16), Mapping::Unallocated);
        assert_eq!(Mapping::decode(ZERO, 16), Mapping::Zero { host: 0 });
        assert_eq!(
            Mapping::decode(COPIED | 0x5_0000, 16),
            Mapping::Data {
                host: 0x5_0000,
                copied: true
            }
        );
        // 64 KiB clusters: x = 54; 2 extra sectors, data at 0x12345.
        let e = COMPRESSED | (2 << 54) | 0x12345;
        let m = Mapping::decode(e, 16);
        assert_eq!(
            m,
            Mapping::Compressed {
                host: 0x12345,
                len: 3 * 512 - 0x145
            }
        );
        assert_eq!(m.host_clusters(16), 1..2);
    }
}
