//! One open directory's stream of entries, for READDIR and READDIRPLUS: linear however the
//! kernel splits the listing.
//!
//! Why state per open directory: the kernel asks for a listing in pieces, each READDIR
//! carrying the offset (cookie) of the last entry it took, and a reply holds as many
//! entries as fit its buffer. A server that answers each piece by reading the directory
//! from the start and skipping (QEMU's 9p synthetic driver, CONTEXT.md) does O(n^2) work;
//! this one keeps the descriptor opened at OPENDIR, its position, and the last
//! `getdents64` batch with the place in it where the previous reply stopped. A READDIR
//! whose offset is where the stream stands continues from there with no system call at all
//! until the batch runs out; any other offset (a rewind, `seekdir`, a second reader of the
//! same open directory) seeks the descriptor to that cookie (`d_off` values are positions
//! `lseek` accepts) and drops the batch. So a whole listing costs one `getdents64` per
//! batch, however many requests it takes.
//!
//! The buffer is allocated once per open directory (at OPENDIR), not per request.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::inodes::Inode;
use crate::sys;

/// Bytes of `getdents64` records read at once: a few hundred entries of typical names.
pub const BATCH: usize = 32 * 1024;

/// One entry, borrowed from the stream's batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    pub ino: u64,
    /// The cookie of the position after this entry: what the kernel sends back to continue
    /// the listing here (`fuse_dirent.off`).
    pub next: u64,
    /// `DT_*` type, as `getdents64` gives it (`DT_UNKNOWN` on some file systems).
    pub kind: u8,
    pub name: &'a [u8],
    /// The same name with its NUL, for the `*at` calls (READDIRPLUS looks each entry up).
    pub cname: &'a std::ffi::CStr,
}

impl DirEntry<'_> {
    /// `.` or `..`, which READDIRPLUS lists without a lookup (the kernel counts none).
    pub fn is_dot(&self) -> bool {
        self.name == b"." || self.name == b".."
    }
}

/// What the stream has done, for tests and statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamStats {
    pub getdents: u64,
    /// Time spent in `getdents64` (the driver's own time, the 9p lesson).
    pub getdents_ns: u64,
    pub seeks: u64,
    pub entries: u64,
}

impl StreamStats {
    /// Field-wise sum.
    pub fn add(&mut self, o: &StreamStats) {
        self.getdents += o.getdents;
        self.getdents_ns += o.getdents_ns;
        self.seeks += o.seeks;
        self.entries += o.entries;
    }
}

/// An open directory's entries and where the listing stands.
pub struct DirStream {
    dir: OwnedFd,
    batch: Box<[u8]>,
    len: usize,
    /// Where the next entry starts in `batch`.
    at: usize,
    /// The cookie of the stream's position (the entry at `at`, or the next batch): a
    /// READDIR with this offset continues without a seek.
    position: u64,
    /// `getdents64` returned 0 at this position.
    end: bool,
    stats: StreamStats,
}

impl DirStream {
    /// Opens `dir` (a directory node) for listing, from the start.
    pub fn open(dir: &Inode) -> io::Result<DirStream> {
        Ok(DirStream {
            dir: sys::open_dir(dir.handle()?.as_fd())?,
            batch: vec![0; BATCH].into_boxed_slice(),
            len: 0,
            at: 0,
            position: 0,
            end: false,
            stats: StreamStats::default(),
        })
    }

    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// The open directory (for FSYNCDIR).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Hands `fill` the entries from `offset` on (0: the start; else a `next` this stream
    /// returned), until it returns false (the reply is full: that entry is not consumed and
    /// comes first next time) or the directory ends. Returns the entries taken.
    pub fn read(
        &mut self,
        offset: u64,
        mut fill: impl FnMut(&DirEntry<'_>) -> bool,
    ) -> io::Result<usize> {
        if offset != self.position {
            sys::seek_dir(self.dir.as_fd(), offset)?;
            self.stats.seeks += 1;
            (self.len, self.at, self.position, self.end) = (0, 0, offset, false);
        }
        let mut taken = 0;
        loop {
            if self.at >= self.len {
                if self.end {
                    break;
                }
                let started = std::time::Instant::now();
                let n = sys::getdents(self.dir.as_fd(), &mut self.batch)?;
                self.stats.getdents_ns += started.elapsed().as_nanos() as u64;
                self.stats.getdents += 1;
                (self.len, self.at, self.end) = (n, 0, n == 0);
                if n == 0 {
                    break;
                }
            }
            let (entry, reclen) = parse(&self.batch[self.at..self.len])?;
            if !fill(&entry) {
                break;
            }
            self.at += reclen;
            self.position = entry.next;
            taken += 1;
        }
        self.stats.entries += taken as u64;
        Ok(taken)
    }
}

/// The `linux_dirent64` at the start of `bytes` and its record length: `d_ino` (u64),
/// `d_off` (i64), `d_reclen` (u16), `d_type` (u8), then the NUL-terminated name.
fn parse(bytes: &[u8]) -> io::Result<(DirEntry<'_>, usize)> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record");
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let ino = u64_at(0).ok_or_else(bad)?;
    let next = u64_at(8).ok_or_else(bad)?;
    let reclen = bytes
        .get(16..18)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]) as usize)
        .ok_or_else(bad)?;
    let record = bytes
        .get(..reclen)
        .filter(|_| reclen > 19)
        .ok_or_else(bad)?;
    let cname = std::ffi::CStr::from_bytes_until_nul(&record[19..]).map_err(|_| bad())?;
    Ok((
        DirEntry {
            ino,
            next,
            kind: record[18],
            name: cname.to_bytes(),
            cname,
        },
        reclen,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ino: u64, off: u64, kind: u8, name: &[u8]) -> Vec<u8> {
        let reclen = (19 + name.len() + 1).next_multiple_of(8);
        let mut r = Vec::with_capacity(reclen);
        r.extend(ino.to_ne_bytes());
        r.extend(off.to_ne_bytes());
        r.extend((reclen as u16).to_ne_bytes());
        r.push(kind);
        r.extend(name);
        r.resize(reclen, 0);
        r
    }

    #[test]
    fn parses_records_and_rejects_broken_ones() {
        let r = record(42, 7, libc::DT_REG, b"file.txt");
        let (e, len) = parse(&r).unwrap();
        assert_eq!(
            (e.ino, e.next, e.kind, e.name, len),
            (42, 7, libc::DT_REG, &b"file.txt"[..], 32)
        );
        assert!(!e.is_dot());
        assert!(parse(&record(1, 1, libc::DT_DIR, b".."))
            .unwrap()
            .0
            .is_dot());
        assert!(parse(&r[..20]).is_err(), "cut short");
        let mut no_nul = r.clone();
        no_nul[19..].fill(b'x');
        assert!(parse(&no_nul).is_err(), "no NUL in the record");
        let mut tiny = r;
        tiny[16..18].copy_from_slice(&8u16.to_ne_bytes());
        assert!(parse(&tiny).is_err(), "record length below the header");
    }
}
