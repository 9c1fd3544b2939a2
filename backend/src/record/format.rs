//! The write log's file format, version 1: what [`super::WriteLog`] appends and what
//! [`Reader`] reads back. All integers are little-endian.
//!
//! ```text
//! file header, 32 bytes:
//!   0  magic    8  b"CFWRLOG\n"
//!   8  version  4  1
//!  12  hdr_len  4  40 (the size of one record header)
//!  16  reserved 16 zero
//! then records, each a 40-byte header and, for writes, `len` bytes of data:
//!   0  kind     1  1 write, 2 durable write, 3 discard, 4 write_zeroes, 5 resize, 6 flush
//!   1  level    1  0 image (what the file or server stores), 1 guest (above qcow2)
//!   2  flags    1  bit 0 FAILED (the operation returned an error), bit 1 UNMAP (zeroes)
//!   3  reserved 5  zero
//!   8  index    8  the record's number, from 0, in log order
//!  16  begun    8  the number the next record would have had when the operation began:
//!                  records below it completed before this one was issued
//!  24  offset   8  byte offset; resize: the new size; flush: its sequence number
//!                  (1, 2, ... per level)
//!  32  len      8  bytes covered; flush and resize: 0
//! ```
//!
//! Records are written in `index` order at positions reserved in that order, so a log cut
//! short (a crash of the recorder, the size cap) ends at the first record that is
//! incomplete or zero; [`Reader`] stops there and says so.

use std::fmt;
use std::io::{self, Read};

/// The first 8 bytes of every log.
pub const MAGIC: [u8; 8] = *b"CFWRLOG\n";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the file header.
pub const FILE_HEADER: usize = 32;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 40;

/// The FAILED flag: the operation returned an error (some of it may have happened).
pub const FAILED: u8 = 1;
/// The UNMAP flag of a write_zeroes (the caller allowed deallocation).
pub const UNMAP: u8 = 2;

/// What a record did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `writev`: the data follows the header.
    Write,
    /// `write_durable`: a write that was durable when it returned (`RWF_DSYNC`); the
    /// writes before it are not made durable by it.
    DurableWrite,
    /// `discard`: the range reads as zeroes.
    Discard,
    /// `write_zeroes`: the range reads as zeroes (growing the image if it ends past it).
    Zeroes,
    /// `resize` to `offset` bytes.
    Resize,
    /// `flush`: the records below `begun` are durable.
    Flush,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Write => 1,
            Kind::DurableWrite => 2,
            Kind::Discard => 3,
            Kind::Zeroes => 4,
            Kind::Resize => 5,
            Kind::Flush => 6,
        }
    }

    fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            1 => Kind::Write,
            2 => Kind::DurableWrite,
            3 => Kind::Discard,
            4 => Kind::Zeroes,
            5 => Kind::Resize,
            6 => Kind::Flush,
            _ => return None,
        })
    }

    /// Whether the record carries `len` bytes of data.
    pub fn has_data(self) -> bool {
        matches!(self, Kind::Write | Kind::DurableWrite)
    }
}

/// Which layer a record was taken at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// What the storage received: the image file (under qcow2), or the raw image.
    Image,
    /// What the export sent to a qcow2 image: the guest's view.
    Guest,
}

impl Level {
    fn code(self) -> u8 {
        match self {
            Level::Image => 0,
            Level::Guest => 1,
        }
    }

    fn from_code(code: u8) -> Option<Level> {
        match code {
            0 => Some(Level::Image),
            1 => Some(Level::Guest),
            _ => None,
        }
    }
}

/// One record's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// What it did.
    pub kind: Kind,
    /// Where it was taken.
    pub level: Level,
    /// [`FAILED`], [`UNMAP`].
    pub flags: u8,
    /// Its number in the log.
    pub index: u64,
    /// Records below this number completed before this operation began.
    pub begun: u64,
    /// Offset; the new size of a resize; the sequence number of a flush.
    pub offset: u64,
    /// Bytes covered.
    pub len: u64,
}

impl Head {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; RECORD_HEADER] {
        let mut b = [0u8; RECORD_HEADER];
        b[0] = self.kind.code();
        b[1] = self.level.code();
        b[2] = self.flags;
        b[8..16].copy_from_slice(&self.index.to_le_bytes());
        b[16..24].copy_from_slice(&self.begun.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; `None` if it is not one (zeroes: the log ends there).
    pub fn decode(b: &[u8; RECORD_HEADER]) -> Option<Head> {
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        Some(Head {
            kind: Kind::from_code(b[0])?,
            level: Level::from_code(b[1])?,
            flags: b[2],
            index: u64_at(8),
            begun: u64_at(16),
            offset: u64_at(24),
            len: u64_at(32),
        })
    }

    /// Whether the operation failed.
    pub fn failed(&self) -> bool {
        self.flags & FAILED != 0
    }

    /// Bytes this record takes in the log.
    pub fn size(&self) -> u64 {
        RECORD_HEADER as u64 + if self.kind.has_data() { self.len } else { 0 }
    }
}

/// The file header's bytes.
pub fn file_header() -> [u8; FILE_HEADER] {
    let mut b = [0u8; FILE_HEADER];
    b[..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(RECORD_HEADER as u32).to_le_bytes());
    b
}

/// One record read back: its header and data.
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    /// The header.
    pub head: Head,
    /// The data of a write (empty for the other kinds).
    pub data: Vec<u8>,
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.head;
        let failed = if h.failed() { " (failed)" } else { "" };
        let level = match h.level {
            Level::Image => "image",
            Level::Guest => "guest",
        };
        write!(f, "#{} {level} ", h.index)?;
        match h.kind {
            Kind::Flush => write!(f, "flush {} (covers < #{})", h.offset, h.begun)?,
            Kind::Resize => write!(f, "resize to {}", h.offset)?,
            kind => write!(f, "{kind:?} {}+{}", h.offset, h.len)?,
        }
        f.write_str(failed)
    }
}

/// Reads a whole log: the records, and why it ended if not at a clean end of file.
pub struct Log {
    /// Every complete record, in order.
    pub records: Vec<Record>,
    /// Set when the log ends in an incomplete or zeroed record (a cut-short log).
    pub truncated: Option<String>,
}

/// Reads the log in `r` (all of it, into memory: logs are test-sized).
pub fn read_log(mut r: impl Read, name: &str) -> io::Result<Log> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {why}"));
    let mut fh = [0u8; FILE_HEADER];
    r.read_exact(&mut fh)
        .map_err(|e| bad(format!("no log header: {e}")))?;
    if fh[..8] != MAGIC {
        return Err(bad("not a corofuse write log (bad magic)".into()));
    }
    let version = u32::from_le_bytes(fh[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(bad(format!("log version {version}, this reads {VERSION}")));
    }
    let mut records = Vec::new();
    let truncated = loop {
        let mut hb = [0u8; RECORD_HEADER];
        match read_full(&mut r, &mut hb)? {
            0 => break None,
            n if n < RECORD_HEADER => break Some(format!("record #{} cut short", records.len())),
            _ => {}
        }
        let Some(head) = Head::decode(&hb) else {
            break Some(format!("record #{} is not one (zeroes)", records.len()));
        };
        if head.index != records.len() as u64 {
            return Err(bad(format!(
                "record #{} carries index {}",
                records.len(),
                head.index
            )));
        }
        let mut data = vec![
            0u8;
            if head.kind.has_data() {
                head.len as usize
            } else {
                0
            }
        ];
        if read_full(&mut r, &mut data)? < data.len() {
            break Some(format!("the data of record #{} is cut short", head.index));
        }
        records.push(Record { head, data });
    };
    Ok(Log { records, truncated })
}

/// Reads as much of `buf` as there is; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_zeroes_end_the_log() {
        let head = Head {
            kind: Kind::Zeroes,
            level: Level::Guest,
            flags: UNMAP,
            index: 7,
            begun: 5,
            offset: 4096,
            len: 512,
        };
        assert_eq!(Head::decode(&head.encode()), Some(head));
        assert_eq!(Head::decode(&[0u8; RECORD_HEADER]), None);
        let mut log = file_header().to_vec();
        let w = Head {
            kind: Kind::Write,
            level: Level::Image,
            flags: 0,
            index: 0,
            begun: 0,
            offset: 10,
            len: 3,
        };
        log.extend_from_slice(&w.encode());
        log.extend_from_slice(b"abc");
        log.extend_from_slice(&[0u8; RECORD_HEADER]);
        let read = read_log(&log[..], "t").unwrap();
        assert_eq!(read.records.len(), 1);
        assert_eq!(read.records[0].data, b"abc");
        assert!(read.truncated.unwrap().contains("record #1"));
    }
}
