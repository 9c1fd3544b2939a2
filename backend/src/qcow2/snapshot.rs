//! Internal snapshots (docs/interop/qcow2.txt, "Snapshots"): the snapshot table, read at
//! open, validated, and searched by ID or name.
//!
//! A snapshot is a copy of the L1 table taken when it was made; its L2 tables and data
//! clusters are shared with the active state, which is why their refcounts are above one
//! and why a write to them copies first (`write.rs`). Snapshots are made and deleted
//! while the image serves in `snapshot_edit.rs` (which writes entries with [`encode`]),
//! and exported read-only with `--snapshot`.
//!
//! Each entry: `l1_table_offset` (8), `l1_size` (4), `id_str_size` (2), `name_size` (2),
//! date (8), VM clock (8), `vm_state_size` (4), `extra_data_size` (4), the extra data
//! (`vm_state_size_large` (8), `disk_size` (8), instruction count (8), as long as it
//! says), the ID, the name, padding to 8 bytes. All big-endian.

use std::io;
use std::ops::Range;

use crate::Ctx;

use super::header::{invalid, Header};
use super::hostio::Host;

/// QEMU's limits (block/qcow2.h): snapshots in a table, and a table's bytes.
pub(crate) const MAX_SNAPSHOTS: u32 = 65536;
pub(crate) const MAX_TABLE_BYTES: u64 = 64 << 20;
/// QEMU's limit on an entry's extra data.
const MAX_EXTRA_DATA: u32 = 1024;
/// The fixed part of an entry, before the extra data.
const FIXED: usize = 40;

/// One internal snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The ID QEMU gave it ("1", "2", ...), unique in the image.
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) l1_table_offset: u64,
    pub(crate) l1_size: u32,
    /// The virtual disk's size when it was made (older images lack it: `None`).
    pub(crate) disk_size: Option<u64>,
    /// When it was made (seconds and nanoseconds since the epoch).
    pub(crate) date_sec: u32,
    pub(crate) date_nsec: u32,
    /// The guest's clock then, in nanoseconds.
    pub(crate) vm_clock_nsec: u64,
    /// Bytes of saved VM state (the large field when the extra data has it).
    pub(crate) vm_state_size: u64,
    /// The instruction count of record/replay (`None`: not recorded, -1 on disk).
    pub(crate) icount: Option<u64>,
    /// Where its entry lies in the table's bytes.
    pub(crate) span: Range<usize>,
}

/// A snapshot as QMP reports it (QAPI `SnapshotInfo`): what
/// [`BlockBackend::snapshot_create`](crate::BlockBackend::snapshot_create) made and
/// [`BlockBackend::snapshot_delete`](crate::BlockBackend::snapshot_delete) removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// "1", "2", ...: unique in the image.
    pub id: String,
    /// Its name (its "tag" in `qemu-img snapshot -l`).
    pub name: String,
    /// Bytes of saved VM state (0 for a disk-only snapshot).
    pub vm_state_size: u64,
    /// When it was made: QMP's `date-sec`, seconds since the epoch.
    pub date_sec: u32,
    /// And `date-nsec`.
    pub date_nsec: u32,
    /// The guest clock then, in nanoseconds: QMP's `vm-clock-sec` is this / 10^9 and
    /// `vm-clock-nsec` this % 10^9.
    pub vm_clock_nsec: u64,
    /// QMP's optional `icount` (omitted when `None`).
    pub icount: Option<u64>,
}

impl From<&Snapshot> for SnapshotInfo {
    fn from(s: &Snapshot) -> SnapshotInfo {
        SnapshotInfo {
            id: s.id.clone(),
            name: s.name.clone(),
            vm_state_size: s.vm_state_size,
            date_sec: s.date_sec,
            date_nsec: s.date_nsec,
            vm_clock_nsec: s.vm_clock_nsec,
            icount: s.icount,
        }
    }
}

/// The bytes of a table entry for `s` (its extra data as QEMU 10 writes it: 24 bytes,
/// `vm_state_size_large`, `disk_size`, `icount`), padded to 8 bytes; `None` if the ID or
/// the name is longer than an entry can say (65535 bytes).
pub(crate) fn encode(
    s: &SnapshotInfo,
    l1_table_offset: u64,
    l1_size: u32,
    disk_size: u64,
) -> Option<Vec<u8>> {
    let id_len = u16::try_from(s.id.len()).ok()?;
    let name_len = u16::try_from(s.name.len()).ok()?;
    let mut e = Vec::with_capacity(FIXED + 24 + s.id.len() + s.name.len() + 7);
    e.extend_from_slice(&l1_table_offset.to_be_bytes());
    e.extend_from_slice(&l1_size.to_be_bytes());
    e.extend_from_slice(&id_len.to_be_bytes());
    e.extend_from_slice(&name_len.to_be_bytes());
    e.extend_from_slice(&s.date_sec.to_be_bytes());
    e.extend_from_slice(&s.date_nsec.to_be_bytes());
    e.extend_from_slice(&s.vm_clock_nsec.to_be_bytes());
    let small = u32::try_from(s.vm_state_size).unwrap_or(0);
    e.extend_from_slice(&small.to_be_bytes());
    e.extend_from_slice(&24u32.to_be_bytes());
    e.extend_from_slice(&s.vm_state_size.to_be_bytes());
    e.extend_from_slice(&disk_size.to_be_bytes());
    e.extend_from_slice(&s.icount.unwrap_or(u64::MAX).to_be_bytes());
    e.extend_from_slice(s.id.as_bytes());
    e.extend_from_slice(s.name.as_bytes());
    e.resize(e.len().next_multiple_of(8), 0);
    Some(e)
}

/// The snapshot table of the image with header `h` (empty without snapshots), and its
/// length in bytes.
pub(crate) fn read_table(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
) -> io::Result<(Vec<Snapshot>, u64)> {
    let (snapshots, raw) = read_table_at(cx, host, h, h.snapshots_offset, h.nb_snapshots)?;
    Ok((snapshots, raw.len() as u64))
}

/// The `count` snapshots of the table at `offset` in the image with header `h` (its
/// geometry), and the table's bytes: every entry, without what follows the last.
pub(crate) fn read_table_at(
    cx: &Ctx<'_>,
    host: &Host,
    h: &Header,
    offset: u64,
    count: u32,
) -> io::Result<(Vec<Snapshot>, Vec<u8>)> {
    if count == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if count > MAX_SNAPSHOTS {
        return Err(invalid(format_args!("{count} snapshots")));
    }
    if offset % h.cluster_size() != 0 || offset == 0 {
        return Err(invalid("snapshot table not aligned to a cluster"));
    }
    // Read a cluster at a time until every entry is in: entries have no fixed size.
    let mut raw = Vec::new();
    let mut snapshots = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    while snapshots.len() < count as usize {
        match parse_entry(&raw[at..], h) {
            Ok(Some((mut snapshot, len))) => {
                snapshot.span = at..at + len;
                snapshots.push(snapshot);
                at += len;
            }
            Ok(None) => {
                let have = raw.len() as u64;
                if have >= MAX_TABLE_BYTES {
                    return Err(invalid("snapshot table larger than 64 MiB"));
                }
                raw.resize(raw.len() + h.cluster_size() as usize, 0);
                host.read_padded(cx, &mut raw[have as usize..], offset + have)?;
            }
            Err(e) => return Err(e),
        }
    }
    for (i, s) in snapshots.iter().enumerate() {
        if snapshots[..i].iter().any(|o| o.id == s.id) {
            return Err(invalid(format_args!("two snapshots with ID {:?}", s.id)));
        }
    }
    raw.truncate(at);
    Ok((snapshots, raw))
}

/// The entry at the start of `raw` and its length with padding, `None` if `raw` ends
/// before it does.
fn parse_entry(raw: &[u8], h: &Header) -> io::Result<Option<(Snapshot, usize)>> {
    let be32 = |at: usize| u32::from_be_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
    let be64 = |at: usize| u64::from_be_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
    if raw.len() < FIXED {
        return Ok(None);
    }
    let l1_table_offset = be64(0);
    let l1_size = be32(8);
    let id_len = u16::from_be_bytes([raw[12], raw[13]]) as usize;
    let name_len = u16::from_be_bytes([raw[14], raw[15]]) as usize;
    let extra = be32(36);
    if extra > MAX_EXTRA_DATA {
        return Err(invalid(format_args!(
            "snapshot extra data of {extra} bytes"
        )));
    }
    let strings = FIXED + extra as usize;
    let len = (strings + id_len + name_len).next_multiple_of(8);
    if raw.len() < len {
        return Ok(None);
    }
    let text = |from: usize, n: usize| String::from_utf8_lossy(&raw[from..from + n]).into_owned();
    let disk_size = (extra >= 16).then(|| be64(FIXED + 8));
    let vm_state_size = match extra >= 8 {
        true => be64(FIXED),
        false => be32(32) as u64,
    };
    let snapshot = Snapshot {
        id: text(strings, id_len),
        name: text(strings + id_len, name_len),
        l1_table_offset,
        l1_size,
        disk_size,
        date_sec: be32(16),
        date_nsec: be32(20),
        vm_clock_nsec: be64(24),
        vm_state_size,
        icount: (extra >= 24)
            .then(|| be64(FIXED + 16))
            .filter(|&i| i != u64::MAX),
        span: 0..len,
    };
    check(&snapshot, h)?;
    Ok(Some((snapshot, len)))
}

/// A snapshot's L1 table: aligned, no larger than QEMU allows, and large enough for its
/// disk.
fn check(s: &Snapshot, h: &Header) -> io::Result<()> {
    let bad = |why: &str| invalid(format_args!("snapshot {:?} ({}): {why}", s.name, s.id));
    if s.l1_table_offset % h.cluster_size() != 0 {
        return Err(bad("L1 table not aligned to a cluster"));
    }
    if s.l1_size as u64 * 8 > super::header::MAX_L1_BYTES {
        return Err(bad("L1 table larger than 32 MiB"));
    }
    if s.l1_size > 0 && s.l1_table_offset == 0 {
        return Err(bad("L1 table at offset 0"));
    }
    let per_l1_entry = h.cluster_size() * h.l2_entries();
    if (s.l1_size as u64) < s.disk_size.unwrap_or(0).div_ceil(per_l1_entry) {
        return Err(bad("L1 table too small for its disk"));
    }
    Ok(())
}

/// The snapshot `key` names: by ID first, then by name, as `qemu-nbd -l` looks it up.
pub(crate) fn find<'a>(snapshots: &'a [Snapshot], key: &str) -> io::Result<&'a Snapshot> {
    let by_id = snapshots.iter().find(|s| s.id == key);
    by_id
        .or_else(|| snapshots.iter().find(|s| s.name == key))
        .ok_or_else(|| {
            let have: Vec<String> = snapshots
                .iter()
                .map(|s| format!("{} ({})", s.id, s.name))
                .collect();
            let have = match have.is_empty() {
                true => "the image has none".to_owned(),
                false => format!("it has {}", have.join(", ")),
            };
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no snapshot with ID or name {key:?}: {have}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, name: &str, l1: u64, l1_size: u32, disk: Option<u64>) -> Vec<u8> {
        let mut e = vec![0u8; FIXED];
        e[..8].copy_from_slice(&l1.to_be_bytes());
        e[8..12].copy_from_slice(&l1_size.to_be_bytes());
        e[12..14].copy_from_slice(&(id.len() as u16).to_be_bytes());
        e[14..16].copy_from_slice(&(name.len() as u16).to_be_bytes());
        if let Some(d) = disk {
            e[36..40].copy_from_slice(&24u32.to_be_bytes());
            e.extend_from_slice(&[0; 8]);
            e.extend_from_slice(&d.to_be_bytes());
            e.extend_from_slice(&[0; 8]);
        }
        e.extend_from_slice(id.as_bytes());
        e.extend_from_slice(name.as_bytes());
        e.resize(e.len().next_multiple_of(8), 0);
        e
    }

    fn header() -> Header {
        let mut first = vec![0u8; 512];
        first[..4].copy_from_slice(&super::super::header::MAGIC);
        first[7] = 2; // version
        first[23] = 16; // cluster_bits
        first[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
        first[39] = 2; // l1_size
        first[40..48].copy_from_slice(&0x30000u64.to_be_bytes());
        first[48..56].copy_from_slice(&0x10000u64.to_be_bytes());
        first[59] = 1;
        Header::parse(&first, false).unwrap()
    }

    #[test]
    fn parses_entries_with_and_without_extra_data() {
        let h = header();
        let mut raw = entry("1", "before upgrade", 0x50000, 2, Some(1 << 30));
        let first_len = raw.len();
        raw.extend(entry("2", "", 0x60000, 2, None));
        let (s, len) = parse_entry(&raw, &h).unwrap().unwrap();
        assert_eq!(
            (len, s.id.as_str(), s.name.as_str()),
            (first_len, "1", "before upgrade")
        );
        assert_eq!((s.l1_table_offset, s.disk_size), (0x50000, Some(1 << 30)));
        let (s, _) = parse_entry(&raw[len..], &h).unwrap().unwrap();
        assert_eq!((s.id.as_str(), s.disk_size), ("2", None));
        // Cut short: more bytes are needed, not an error.
        assert!(parse_entry(&raw[..first_len - 1], &h).unwrap().is_none());
    }

    #[test]
    fn refuses_damaged_entries() {
        let h = header();
        let err = |e: Vec<u8>| parse_entry(&e, &h).unwrap_err().to_string();
        assert!(err(entry("1", "a", 0x50001, 2, None)).contains("not aligned"));
        assert!(err(entry("1", "a", 0x50000, 1, Some(1 << 40))).contains("too small"));
        let mut e = entry("1", "a", 0x50000, 2, None);
        e[36..40].copy_from_slice(&4096u32.to_be_bytes());
        assert!(err(e).contains("extra data"));
    }

    /// Bytes of any shape parse to an entry, a need for more, or an error: never a panic.
    #[test]
    fn random_bytes_never_panic() {
        let h = header();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 200) as usize;
            let mut raw: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len > 40 && next() % 2 == 0 {
                raw[36..40].copy_from_slice(&((next() % 64) as u32).to_be_bytes());
                raw[12..16].copy_from_slice(&[0, (next() % 8) as u8, 0, (next() % 8) as u8]);
            }
            let _ = parse_entry(&raw, &h);
        }
    }

    #[test]
    fn encoded_entries_parse_back() {
        let h = header();
        let info = SnapshotInfo {
            id: "3".into(),
            name: "before upgrade".into(),
            vm_state_size: 0,
            date_sec: 1_796_528_764,
            date_nsec: 513_851_000,
            vm_clock_nsec: 1_796_528_764_513_852_000,
            icount: None,
        };
        let raw = encode(&info, 0x50000, 2, 1 << 30).unwrap();
        assert_eq!(raw.len(), (40 + 24 + 1 + 14usize).next_multiple_of(8));
        let (s, len) = parse_entry(&raw, &h).unwrap().unwrap();
        assert_eq!(len, raw.len());
        assert_eq!(SnapshotInfo::from(&s), info);
        assert_eq!(
            (s.l1_table_offset, s.l1_size, s.disk_size),
            (0x50000, 2, Some(1 << 30))
        );
        // icount -1, as QEMU writes it without record/replay.
        assert_eq!(&raw[56..64], &[0xff; 8]);
    }

    #[test]
    fn finds_by_id_then_by_name() {
        let s = |id: &str, name: &str| Snapshot {
            id: id.into(),
            name: name.into(),
            l1_table_offset: 0,
            l1_size: 0,
            disk_size: None,
            date_sec: 0,
            date_nsec: 0,
            vm_clock_nsec: 0,
            vm_state_size: 0,
            icount: None,
            span: 0..0,
        };
        let all = [s("1", "2"), s("2", "clean")];
        assert_eq!(find(&all, "2").unwrap().name, "clean"); // the ID wins
        assert_eq!(find(&all, "clean").unwrap().id, "2");
        let e = find(&all, "nope").unwrap_err().to_string();
        assert!(e.contains("1 (2), 2 (clean)"), "{e}");
    }
}
