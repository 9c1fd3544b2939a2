//! The qcow2 header (the image's first cluster): parsed, validated, and refused with one
//! line naming the feature where corofuse cannot serve the image.
//!
//! Layout (QEMU's docs/interop/qcow2.txt, all big-endian): 72 bytes for version 2, at least
//! 104 (`header_length`) for version 3, then header extensions (type, length, data padded
//! to 8) up to an end marker, all inside the first cluster; the backing file name lies
//! wherever `backing_file_offset` says.

use std::io;

/// "QFI\xfb".
pub(crate) const MAGIC: [u8; 4] = *b"QFI\xfb";

/// Incompatible feature bits (header bytes 72-79).
pub(crate) const DIRTY: u64 = 1 << 0;
pub(crate) const CORRUPT: u64 = 1 << 1;
const EXTERNAL_DATA_FILE: u64 = 1 << 2;
const COMPRESSION_TYPE: u64 = 1 << 3;
const EXTENDED_L2: u64 = 1 << 4;
/// The incompatible bits this implementation understands (it refuses or handles each).
const KNOWN_INCOMPATIBLE: u64 =
    DIRTY | CORRUPT | EXTERNAL_DATA_FILE | COMPRESSION_TYPE | EXTENDED_L2;

/// Header extension types.
const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;

/// Byte offsets of the fields the backend rewrites.
pub(crate) const SIZE_FIELD: u64 = 24;
pub(crate) const INCOMPATIBLE_FIELD: u64 = 72;
pub(crate) const AUTOCLEAR_FIELD: u64 = 88;
/// `refcount_table_offset` (8 bytes), then `refcount_table_clusters` (4).
pub(crate) const REFCOUNT_TABLE_FIELD: u64 = 48;

/// QEMU's limits: 2 MiB clusters, a 32 MiB L1 table.
pub(crate) const MIN_CLUSTER_BITS: u32 = 9;
pub(crate) const MAX_CLUSTER_BITS: u32 = 21;
pub(crate) const MAX_L1_BYTES: u64 = 32 << 20;
/// QEMU's limit on the refcount table (block/qcow2.h `QCOW_MAX_REFTABLE_SIZE`).
pub(crate) const MAX_REFTABLE_BYTES: u64 = 8 << 20;
const MAX_BACKING_NAME: u32 = 1023;

/// How compressed clusters are compressed (header byte 104, v3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    /// Raw deflate (zlib without its header), window 4 KiB; the default.
    Deflate,
    /// One zstd frame per cluster.
    Zstd,
}

/// The fields of a valid header that the backend uses.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) cluster_bits: u32,
    /// Virtual disk size in bytes.
    pub(crate) size: u64,
    pub(crate) l1_size: u32,
    pub(crate) l1_table_offset: u64,
    pub(crate) refcount_table_offset: u64,
    pub(crate) refcount_table_clusters: u32,
    /// Incompatible feature bits (0 for v2), [`DIRTY`] among them.
    pub(crate) incompatible: u64,
    pub(crate) autoclear: u64,
    /// log2 of the refcount width in bits (4: 16-bit refcounts, always so in v2).
    pub(crate) refcount_order: u32,
    pub(crate) compression: Compression,
    /// Where the backing file name lies, and its length (0: no backing file).
    pub(crate) backing_name_at: u64,
    pub(crate) backing_name_len: u32,
    /// The backing format extension ("raw", "qcow2"), if present.
    pub(crate) backing_format: Option<String>,
    /// Internal snapshots, and where their table lies (`snapshot.rs`).
    pub(crate) nb_snapshots: u32,
    pub(crate) snapshots_offset: u64,
}

/// Big-endian fields of the first cluster, `None` past its end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u32(&self, at: usize) -> Option<u32> {
        Some(u32::from_be_bytes(self.0.get(at..at + 4)?.try_into().ok()?))
    }
    fn u64(&self, at: usize) -> Option<u64> {
        Some(u64::from_be_bytes(self.0.get(at..at + 8)?.try_into().ok()?))
    }
}

/// An error for an image whose header is damaged: `InvalidData`.
pub(crate) fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("invalid qcow2 image: {why}"),
    )
}

/// An error for a feature corofuse does not implement: `Unsupported`.
pub(crate) fn unsupported(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("qcow2 image uses {what}, which corofuse does not support"),
    )
}

impl Header {
    /// The cluster size in bytes.
    pub(crate) fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Entries in an L2 table (and in the L1 table's clusters).
    pub(crate) fn l2_entries(&self) -> u64 {
        self.cluster_size() / 8
    }

    /// Reads the cluster bits, which say how much of the file holds the whole header.
    pub(crate) fn cluster_bits_of(head: &[u8]) -> io::Result<u32> {
        let b = Bytes(head);
        if head.get(..4) != Some(&MAGIC[..]) {
            return Err(invalid("no qcow2 magic"));
        }
        let bits = b.u32(20).ok_or_else(|| invalid("header cut short"))?;
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&bits) {
            return Err(invalid(format_args!(
                "cluster_bits {bits} (supported: {MIN_CLUSTER_BITS} to {MAX_CLUSTER_BITS})"
            )));
        }
        Ok(bits)
    }

    /// Parses and validates the first cluster (or as much of it as the file holds), for an
    /// image opened `writable` or not.
    pub(crate) fn parse(first: &[u8], writable: bool) -> io::Result<Header> {
        let cluster_bits = Header::cluster_bits_of(first)?;
        let b = Bytes(first);
        let short = || invalid("header cut short");
        let version = b.u32(4).ok_or_else(short)?;
        if version != 2 && version != 3 {
            return Err(unsupported(format_args!(
                "version {version} (supported: 2 and 3)"
            )));
        }
        let (incompatible, autoclear, refcount_order, header_length) = match version {
            2 => (0, 0, 4, 72),
            _ => (
                b.u64(72).ok_or_else(short)?,
                b.u64(88).ok_or_else(short)?,
                b.u32(96).ok_or_else(short)?,
                b.u32(100).ok_or_else(short)?,
            ),
        };
        if version == 3 && (header_length < 104 || header_length % 8 != 0) {
            return Err(invalid(format_args!("header_length {header_length}")));
        }
        let header_end = header_length as usize;
        if header_end > first.len() {
            return Err(short());
        }
        let compression = match (incompatible & COMPRESSION_TYPE != 0, header_length > 104) {
            (false, _) => Compression::Deflate,
            (true, false) => return Err(invalid("compression type bit without the field")),
            (true, true) => match first[104] {
                0 => return Err(invalid("compression type bit with zlib")),
                1 => Compression::Zstd,
                n => return Err(unsupported(format_args!("compression type {n}"))),
            },
        };
        let feature_names = extensions(first, header_end)?;
        check_features(incompatible, &feature_names.names, writable)?;
        let crypt = b.u32(32).ok_or_else(short)?;
        if crypt != 0 {
            let kind = if crypt == 1 { "AES" } else { "LUKS" };
            return Err(unsupported(format_args!("encryption ({kind})")));
        }
        if refcount_order > 6 {
            return Err(invalid(format_args!("refcount_order {refcount_order}")));
        }
        let header = Header {
            version,
            cluster_bits,
            size: b.u64(24).ok_or_else(short)?,
            l1_size: b.u32(36).ok_or_else(short)?,
            l1_table_offset: b.u64(40).ok_or_else(short)?,
            refcount_table_offset: b.u64(48).ok_or_else(short)?,
            refcount_table_clusters: b.u32(56).ok_or_else(short)?,
            incompatible,
            autoclear,
            refcount_order,
            compression,
            backing_name_at: b.u64(8).ok_or_else(short)?,
            backing_name_len: b.u32(16).ok_or_else(short)?,
            backing_format: feature_names.backing_format,
            nb_snapshots: b.u32(60).ok_or_else(short)?,
            snapshots_offset: b.u64(64).ok_or_else(short)?,
        };
        header.check_tables()?;
        Ok(header)
    }

    /// Every range the header points at lies inside a file of `file_len` bytes; else an
    /// error naming the field, as qemu-img names it ("Invalid backing file offset").
    pub(crate) fn check_ranges(&self, file_len: u64) -> io::Result<()> {
        let snapshot_header = 40; // the fixed part of one snapshot table entry
        let ranges = [
            (
                "backing file offset",
                self.backing_name_at,
                self.backing_name_len as u64,
            ),
            (
                "L1 table offset",
                self.l1_table_offset,
                self.l1_size as u64 * 8,
            ),
            (
                "refcount table offset",
                self.refcount_table_offset,
                (self.refcount_table_clusters as u64) << self.cluster_bits,
            ),
            (
                "snapshot table offset",
                self.snapshots_offset,
                self.nb_snapshots as u64 * snapshot_header,
            ),
        ];
        for (field, offset, len) in ranges {
            let present = match field {
                "backing file offset" => offset != 0,
                _ => len != 0,
            };
            let end = offset.checked_add(len).filter(|&end| end <= file_len);
            if present && end.is_none() {
                return Err(invalid(format_args!(
                    "Invalid {field}: {len} bytes at {offset:#x} lie past the end of the \
                     file ({file_len} bytes)"
                )));
            }
        }
        Ok(())
    }

    /// The table fields: aligned, and an L1 table large enough for the size.
    fn check_tables(&self) -> io::Result<()> {
        let mask = self.cluster_size() - 1;
        if self.l1_table_offset & mask != 0 || self.refcount_table_offset & mask != 0 {
            return Err(invalid("L1 or refcount table not aligned to a cluster"));
        }
        let per_l1_entry = self.cluster_size() * self.l2_entries();
        let needed = self.size.div_ceil(per_l1_entry);
        if (self.l1_size as u64) < needed || self.l1_size as u64 * 8 > MAX_L1_BYTES {
            return Err(invalid(format_args!(
                "L1 table of {} entries for a disk of {} bytes",
                self.l1_size, self.size
            )));
        }
        if self.refcount_table_clusters == 0 {
            return Err(invalid("no refcount table"));
        }
        if (self.refcount_table_clusters as u64) << self.cluster_bits > MAX_REFTABLE_BYTES {
            return Err(invalid(format_args!(
                "refcount table of {} clusters (QEMU's limit: 8 MiB)",
                self.refcount_table_clusters
            )));
        }
        if self.backing_name_at != 0 && self.backing_name_len > MAX_BACKING_NAME {
            return Err(invalid("backing file name longer than 1023 bytes"));
        }
        Ok(())
    }
}

/// What the header extensions say that the backend uses.
#[derive(Default)]
struct Extensions {
    /// (kind, bit, name) from the feature name table, for error messages.
    names: Vec<(u8, u8, String)>,
    backing_format: Option<String>,
}

/// Walks the header extensions from `at` to the end marker, each checked to lie inside the
/// first cluster. Unknown extensions are skipped, as the spec allows.
fn extensions(first: &[u8], mut at: usize) -> io::Result<Extensions> {
    let b = Bytes(first);
    let mut found = Extensions::default();
    while let Some(kind) = b.u32(at) {
        if kind == EXT_END {
            break;
        }
        let len = b
            .u32(at + 4)
            .ok_or_else(|| invalid("header extension cut short"))? as usize;
        let data = first.get(at + 8..at + 8 + len).ok_or_else(|| {
            invalid(format_args!(
                "header extension {kind:#x} past the first cluster"
            ))
        })?;
        match kind {
            EXT_BACKING_FORMAT => {
                found.backing_format = Some(String::from_utf8_lossy(data).into_owned())
            }
            EXT_FEATURE_NAMES => {
                for entry in data.chunks_exact(48) {
                    let name = entry[2..].split(|&c| c == 0).next().unwrap_or_default();
                    let name = String::from_utf8_lossy(name).into_owned();
                    found.names.push((entry[0], entry[1], name));
                }
            }
            _ => {}
        }
        at += 8 + len.next_multiple_of(8);
    }
    Ok(found)
}

/// Refuses the incompatible features corofuse does not implement, and a corrupt image
/// opened for writing. A dirty one (refcounts not written back: QEMU with lazy refcounts,
/// or corofuse, killed) passes: opened for writing, it is repaired first (`repair.rs`), as
/// QEMU repairs it; read-only, it is read as it is (reads need no refcounts).
fn check_features(bits: u64, names: &[(u8, u8, String)], writable: bool) -> io::Result<()> {
    if bits & EXTERNAL_DATA_FILE != 0 {
        return Err(unsupported("an external data file"));
    }
    if bits & EXTENDED_L2 != 0 {
        return Err(unsupported("extended L2 entries (subclusters)"));
    }
    let unknown = bits & !KNOWN_INCOMPATIBLE;
    if unknown != 0 {
        let bit = unknown.trailing_zeros() as u8;
        let name = names
            .iter()
            .find(|(kind, b, _)| *kind == 0 && *b == bit)
            .map_or(String::new(), |(_, _, n)| format!(" ({n})"));
        return Err(unsupported(format_args!(
            "incompatible feature bit {bit}{name}"
        )));
    }
    if writable && bits & CORRUPT != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "qcow2 image is marked corrupt: repair it with qemu-img check -r all, or export it read-only",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v3 header: 64 KiB clusters, 1 GiB disk, L1 of 2 entries at 0x30000, refcount
    /// table of 1 cluster at 0x10000, 16-bit refcounts, header_length 112.
    fn v3() -> Vec<u8> {
        let mut h = vec![0u8; 4096];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&3u32.to_be_bytes()); // version
        h[20..24].copy_from_slice(&16u32.to_be_bytes()); // cluster_bits
        h[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes()); // size
        h[36..40].copy_from_slice(&2u32.to_be_bytes()); // l1_size
        h[40..48].copy_from_slice(&0x30000u64.to_be_bytes()); // l1_table_offset
        h[48..56].copy_from_slice(&0x10000u64.to_be_bytes()); // refcount_table_offset
        h[56..60].copy_from_slice(&1u32.to_be_bytes()); // refcount_table_clusters
        h[96..100].copy_from_slice(&4u32.to_be_bytes()); // refcount_order
        h[100..104].copy_from_slice(&112u32.to_be_bytes()); // header_length
        h
    }

    fn err(h: &[u8], writable: bool) -> String {
        Header::parse(h, writable).unwrap_err().to_string()
    }

    #[test]
    fn ranges_past_the_end_of_the_file_name_their_field() {
        let h = Header::parse(&v3(), false).unwrap();
        h.check_ranges(0x40000).unwrap();
        let e = h.check_ranges(0x30008).unwrap_err().to_string();
        assert!(
            e.contains("Invalid L1 table offset: 16 bytes at 0x30000"),
            "{e}"
        );
        let mut raw = v3();
        raw[8..16].copy_from_slice(&0x7fff_ffff_ffff_ff00u64.to_be_bytes());
        raw[16..20].copy_from_slice(&13u32.to_be_bytes());
        let h = Header::parse(&raw, false).unwrap();
        let e = h.check_ranges(0x40000).unwrap_err().to_string();
        assert!(e.contains("Invalid backing file offset"), "{e}");
    }

    #[test]
    fn parses_a_v3_header() {
        let h = Header::parse(&v3(), true).unwrap();
        assert_eq!(
            (h.version, h.cluster_size(), h.size, h.l1_size),
            (3, 65536, 1 << 30, 2)
        );
        assert_eq!((h.refcount_order, h.compression), (4, Compression::Deflate));
    }

    #[test]
    fn refuses_what_it_cannot_serve() {
        let mut h = v3();
        h[35] = 2; // crypt_method
        assert!(err(&h, false).contains("encryption (LUKS)"));
        let mut h = v3();
        h[79] = 1 << 2;
        assert!(err(&h, false).contains("external data file"));
        let mut h = v3();
        h[79] = 1 << 4;
        assert!(err(&h, false).contains("extended L2 entries"));
        let mut h = v3();
        h[78] = 1; // bit 8, named in a feature name table
        h[112..116].copy_from_slice(&EXT_FEATURE_NAMES.to_be_bytes());
        h[116..120].copy_from_slice(&48u32.to_be_bytes());
        h[121] = 8;
        h[122..127].copy_from_slice(b"magic");
        assert!(
            err(&h, false).contains("incompatible feature bit 8 (magic)"),
            "{}",
            err(&h, false)
        );
    }

    #[test]
    fn a_dirty_image_opens_a_corrupt_one_read_only_only() {
        let mut h = v3();
        h[79] = DIRTY as u8;
        assert_eq!(Header::parse(&h, true).unwrap().incompatible, DIRTY);
        h[79] = CORRUPT as u8;
        assert!(Header::parse(&h, false).is_ok());
        assert!(err(&h, true).contains("qemu-img check -r all"));
    }

    #[test]
    fn cluster_bits_out_of_range() {
        let mut h = v3();
        h[23] = 22;
        assert!(err(&h, false).contains("cluster_bits 22"));
        h[23] = 8;
        assert!(err(&h, false).contains("cluster_bits 8"));
    }

    #[test]
    fn a_short_l1_table_is_invalid() {
        let mut h = v3();
        h[36..40].copy_from_slice(&1u32.to_be_bytes());
        assert!(err(&h, false).contains("L1 table of 1 entries"));
    }
}
