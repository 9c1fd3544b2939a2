//! Write recording (`corofuse mount --record-writes PATH`): [`RecordBackend`] wraps a
//! backend and appends to a [`WriteLog`], in order, every write, write_durable, discard,
//! write_zeroes, resize and flush that reaches it, with the data ([`format`] has the file
//! layout).
//!
//! Why: a killed daemon loses nothing the host page cache holds, so killing it cannot show
//! an ordering bug. Power loss drops every write not yet flushed and may keep any subset
//! of them, torn at sector boundaries. The log is what a crash-state checker
//! ([`crate::crash`]) needs to build those states: the writes and flushes the storage
//! received, in order (as Linux's dm-log-writes gives xfstests).
//!
//! # Where the layers go
//! [`crate::open_recorded`] puts one layer at [`Level::Image`] on what stores the bytes
//! (the image file, or the NBD export): for qcow2 that is *under* the qcow2 layer, so the
//! log holds every metadata and data write and every flush and `RWF_DSYNC` write the qcow2
//! code sends to its file, in the order the file got them. For a qcow2 image a second
//! layer at [`Level::Guest`] sits above it and records what the export asked of the disk:
//! the writes a crash must not lose once a flush covering them returned.
//!
//! # What a record means
//! A record is appended when the operation has completed (and before the layer above
//! hears of it), so a write acknowledged to the client is in the log. Each record carries
//! `begun`, the log's length when the operation began: a flush covers exactly the records
//! below its `begun` (those completed before it was issued), and an operation whose
//! record lies past a crash point but whose `begun` lies before it was in flight then.
//! A failed operation is recorded with the FAILED flag (some of it may have happened).

pub mod format;
mod log;
pub mod replay;

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;

use crate::{iov, BackendStats, BlockBackend, Ctx, Extent, InjectStats};
pub use format::{Head, Kind, Level, Record};
pub use log::{WriteLog, DEFAULT_CAP};
pub use replay::{replay, Replayed};

/// A backend whose modifications are recorded in a [`WriteLog`] at one [`Level`].
pub struct RecordBackend {
    inner: Arc<dyn BlockBackend>,
    log: Arc<WriteLog>,
    level: Level,
}

impl RecordBackend {
    /// Records what reaches `inner` in `log`, tagged `level`.
    pub fn new(inner: Arc<dyn BlockBackend>, log: Arc<WriteLog>, level: Level) -> RecordBackend {
        RecordBackend { inner, log, level }
    }

    /// Wraps `inner` for `log`, if there is one.
    pub(crate) fn wrap(
        inner: Arc<dyn BlockBackend>,
        log: Option<&Arc<WriteLog>>,
        level: Level,
    ) -> Arc<dyn BlockBackend> {
        match log {
            Some(log) => Arc::new(RecordBackend::new(inner, Arc::clone(log), level)),
            None => inner,
        }
    }

    /// Runs `op` as an operation of `kind` on `[offset, +len)` and records it (with
    /// `data` for writes; `flags` besides FAILED).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        cx: &Ctx<'_>,
        kind: Kind,
        flags: u8,
        offset: u64,
        len: u64,
        data: &[IoSlice<'_>],
        op: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.log.reserve(kind, len)?;
        let begun = self.log.next_index();
        let result = op();
        let failed = if result.is_err() { format::FAILED } else { 0 };
        let offset = match kind {
            Kind::Flush => self.log.next_flush(self.level),
            _ => offset,
        };
        let head = Head {
            kind,
            level: self.level,
            flags: flags | failed,
            index: 0,
            begun,
            offset,
            len,
        };
        self.log.append(cx, head, data)?;
        result
    }
}

impl BlockBackend for RecordBackend {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.inner.readv(cx, bufs, offset)
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        let len = iov::total(bufs) as u64;
        self.run(cx, Kind::Write, 0, offset, len, bufs, || {
            self.inner.writev(cx, bufs, offset)
        })
    }

    fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        let data = [IoSlice::new(buf)];
        let len = buf.len() as u64;
        self.run(cx, Kind::DurableWrite, 0, offset, len, &data, || {
            self.inner.write_durable(cx, buf, offset)
        })
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.run(cx, Kind::Flush, 0, 0, 0, &[], || self.inner.flush(cx))
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.run(cx, Kind::Discard, 0, offset, len, &[], || {
            self.inner.discard(cx, offset, len)
        })
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        let flags = if may_unmap { format::UNMAP } else { 0 };
        self.run(cx, Kind::Zeroes, flags, offset, len, &[], || {
            self.inner.write_zeroes(cx, offset, len, may_unmap)
        })
    }

    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.run(cx, Kind::Resize, 0, new_len, 0, &[], || {
            self.inner.resize(cx, new_len)
        })
    }

    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        self.inner.block_status(cx, offset)
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        self.inner.allocated_bytes()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn describe(&self) -> String {
        let level = match self.level {
            Level::Image => "",
            Level::Guest => " (guest level)",
        };
        let log = self.log.path().display();
        format!(
            "{}, recording writes{level} to {log}",
            self.inner.describe()
        )
    }

    fn stats(&self) -> BackendStats {
        self.inner.stats()
    }

    fn inject_stats(&self) -> Option<InjectStats> {
        self.inner.inject_stats()
    }

    /// The layer below closes itself (its closing writes go through the image level's
    /// log, as any write); a close acknowledges nothing to a guest, so it is no record.
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.inner.close(cx)
    }

    fn open_warning(&self) -> Option<String> {
        self.inner.open_warning()
    }

    // No passthrough: writes through a passed-through mapping would bypass the log.

    fn abort(&self) {
        self.inner.abort();
    }

    fn waits_are_bounded(&self) -> bool {
        self.inner.waits_are_bounded()
    }

    /// Not recorded: what it writes reaches the image through the recorded file below.
    fn snapshot_create(&self, cx: &Ctx<'_>, name: &str) -> io::Result<crate::SnapshotInfo> {
        self.inner.snapshot_create(cx, name)
    }

    fn snapshot_delete(
        &self,
        cx: &Ctx<'_>,
        id: Option<&str>,
        name: Option<&str>,
    ) -> io::Result<crate::SnapshotInfo> {
        self.inner.snapshot_delete(cx, id, name)
    }
}
