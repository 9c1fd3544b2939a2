//! [`WriteLog`]: the file a recording layer appends to, shared by every layer and request
//! of one export.
//!
//! Each record's place (its index and its byte position) is taken under a short lock that
//! covers no I/O; the record is then written there through the caller's [`Ctx`] (the
//! loop's io_uring in a coroutine, `pwritev` on a thread), header and data in one
//! `writev` when the data has at most [`INLINE_IOVECS`] pieces. So records land in index
//! order whatever order their writes finish in, and a coroutine never holds a lock while it
//! waits. Nothing is allocated per record: the header lives on the stack.
//!
//! The log is not synced: it is a test instrument, complete once the daemon has exited
//! (the page cache holds it).
//!
//! # The size cap
//! Space is reserved before the operation runs, so a full log fails the operation with
//! `ENOSPC` before it reaches the image (one error line, the first time): nothing happens
//! that the log does not show. Records without data (flush, resize, discard, zeroes) may
//! use [`SLACK`] bytes past the cap, so that the flushes after a refused write are still
//! recorded.

use std::fs::File;
use std::io::{self, IoSlice};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::format::{self, Head, Kind, Level, RECORD_HEADER};
use crate::Ctx;

/// Iovecs of data written with the header in one call; more go in further calls.
pub const INLINE_IOVECS: usize = 15;
/// Bytes past the cap that records without data may use.
pub const SLACK: u64 = 1 << 20;
/// The default cap (`--record-writes-max`).
pub const DEFAULT_CAP: u64 = 1 << 30;

/// An open write log.
pub struct WriteLog {
    file: File,
    path: PathBuf,
    cap: u64,
    /// Bytes reserved by operations begun (the file header included).
    reserved: AtomicU64,
    /// The next record's index and byte position.
    next: Mutex<Next>,
    /// Flushes recorded, per level: the sequence number of the next one, minus one.
    flushes: [AtomicU64; 2],
    /// Whether the "log is full" line was written.
    full: AtomicBool,
}

struct Next {
    index: u64,
    pos: u64,
}

impl WriteLog {
    /// Creates (or truncates) the log at `path`, holding at most `cap` bytes.
    pub fn create(path: &Path, cap: u64) -> io::Result<WriteLog> {
        let fail = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot create write log {}: {e}", path.display()),
            )
        };
        let file = File::create(path).map_err(fail)?;
        let header = format::file_header();
        std::os::unix::fs::FileExt::write_all_at(&file, &header, 0).map_err(fail)?;
        let start = header.len() as u64;
        Ok(WriteLog {
            file,
            path: path.to_owned(),
            cap,
            reserved: AtomicU64::new(start),
            next: Mutex::new(Next {
                index: 0,
                pos: start,
            }),
            flushes: Default::default(),
            full: AtomicBool::new(false),
        })
    }

    /// Where the log is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes reserved so far (the log's size once every operation has finished).
    pub fn bytes(&self) -> u64 {
        self.reserved.load(Relaxed)
    }

    /// Reserves room for a record of `kind` with `len` bytes, before the operation runs;
    /// `ENOSPC` (and one error line, the first time) past the cap.
    pub(crate) fn reserve(&self, kind: Kind, len: u64) -> io::Result<()> {
        let (size, cap) = match kind.has_data() {
            true => (RECORD_HEADER as u64 + len, self.cap),
            false => (RECORD_HEADER as u64, self.cap.saturating_add(SLACK)),
        };
        let fits = |r: u64| r.checked_add(size).filter(|&end| end <= cap);
        if self.reserved.fetch_update(Relaxed, Relaxed, fits).is_ok() {
            return Ok(());
        }
        if !self.full.swap(true, Relaxed) {
            log::error!(
                "write log {} is full ({cap} bytes): image writes now fail with ENOSPC \
                 (raise --record-writes-max)",
                self.path.display()
            );
        }
        Err(io::Error::from_raw_os_error(libc::ENOSPC))
    }

    /// The index the next record will get: taken when an operation begins.
    pub(crate) fn next_index(&self) -> u64 {
        self.lock().index
    }

    /// The next flush sequence number of `level`.
    pub(crate) fn next_flush(&self, level: Level) -> u64 {
        let i = match level {
            Level::Image => 0,
            Level::Guest => 1,
        };
        self.flushes[i].fetch_add(1, Relaxed) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Next> {
        self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a record: `head` (its index is set here) and, for writes, `data`.
    pub(crate) fn append(
        &self,
        cx: &Ctx<'_>,
        mut head: Head,
        data: &[IoSlice<'_>],
    ) -> io::Result<()> {
        let pos = {
            let mut next = self.lock();
            head.index = next.index;
            let pos = next.pos;
            next.index += 1;
            next.pos += head.size();
            pos
        };
        let header = head.encode();
        let data = if head.kind.has_data() { data } else { &[] };
        let res = self.write_record(cx, &header, data, pos);
        res.map_err(|e| {
            log::error!(
                "write log {}: cannot append record #{}: {e}",
                self.path.display(),
                head.index
            );
            io::Error::new(e.kind(), format!("write log: {e}"))
        })
    }

    fn write_record(
        &self,
        cx: &Ctx<'_>,
        header: &[u8; RECORD_HEADER],
        data: &[IoSlice<'_>],
        mut pos: u64,
    ) -> io::Result<()> {
        let mut slot = [IoSlice::new(&[]); INLINE_IOVECS + 1];
        slot[0] = IoSlice::new(header);
        let first = data.len().min(INLINE_IOVECS);
        slot[1..=first].copy_from_slice(&data[..first]);
        pos = self.write_all(cx, &mut slot[..=first], pos)?;
        for chunk in data[first..].chunks(INLINE_IOVECS + 1) {
            let n = chunk.len();
            slot[..n].copy_from_slice(chunk);
            pos = self.write_all(cx, &mut slot[..n], pos)?;
        }
        Ok(())
    }

    /// Writes all of `bufs` at `pos`; returns the position after them.
    fn write_all(
        &self,
        cx: &Ctx<'_>,
        mut bufs: &mut [IoSlice<'_>],
        mut pos: u64,
    ) -> io::Result<u64> {
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            let n = cx.writev_at(&self.file, bufs, pos)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            pos += n as u64;
            IoSlice::advance_slices(&mut bufs, n);
        }
        Ok(pos)
    }
}
