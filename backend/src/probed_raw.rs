//! [`ProbedRaw`]: a raw image whose format was guessed, whose first sector may never be made
//! to look like another format.
//!
//! Why: see [`crate::probe`]. A raw image opened without `--format raw` was probed, so
//! the next open without a format will probe it again; if a writer of the export could put
//! a qcow2 header (or a VMDK descriptor) there, that next open would follow whatever
//! backing file or extent the header names, any file the daemon may read. QEMU refuses
//! such writes with `EPERM` (block/raw-format.c) and says so when it probes; this does the
//! same for every modification that reaches the first sector: writes, zeroes, discards
//! (they read back as zeroes) and shrinking resizes.
//!
//! How: a modification that touches the first [`PROBE_BYTES`] holds one lock (so two
//! writes cannot each pass the check and together form a header), reads the sector as it
//! is, lays the change over it in a stack buffer and probes the result; only a result that
//! still probes as raw is written, under the same lock. Requests past the first sector
//! pass straight through: nothing is added to them.

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::probe::{foreign_format, PROBE_BYTES};
use crate::serial::Serial;
use crate::{BackendStats, BlockBackend, Ctx, Extent, InjectStats};

/// What is read of the image to check its first sector: a page (see `guarded`).
const HEAD_BYTES: usize = 4096;

/// A page-aligned page.
#[repr(C, align(4096))]
struct Head([u8; HEAD_BYTES]);

/// A writable raw image whose format was probed.
pub struct ProbedRaw {
    inner: Arc<dyn BlockBackend>,
    /// The image's path, for the warning.
    path: std::path::PathBuf,
    /// Held by a modification of the first sector, from its check to its end.
    first_sector: Serial,
    /// Modifications refused so far.
    refused: AtomicU64,
}

/// What a modification does to the first sector.
enum Change<'a> {
    Write(&'a [IoSlice<'a>], u64),
    Zeroes(u64, u64),
    Resize(u64),
}

impl ProbedRaw {
    /// Guards `inner`, the raw image at `path` opened for writing without a format.
    pub fn new(inner: Arc<dyn BlockBackend>, path: &std::path::Path) -> ProbedRaw {
        ProbedRaw {
            inner,
            path: path.to_owned(),
            first_sector: Serial::default(),
            refused: AtomicU64::new(0),
        }
    }

    /// Modifications of the first sector refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Runs `op` (the modification `change` describes) if the first sector still probes as
    /// raw after it; `EPERM` if not.
    fn guarded<T>(
        &self,
        cx: &Ctx<'_>,
        change: Change<'_>,
        op: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let touches = match change {
            Change::Write(_, offset) | Change::Zeroes(offset, _) => offset < PROBE_BYTES as u64,
            Change::Resize(len) => len < PROBE_BYTES as u64,
        };
        if !touches {
            return op();
        }
        let _held = self.first_sector.lock(cx);
        // A whole page, page-aligned, so that an O_DIRECT image reads it in place (no
        // bounce buffer) whatever its logical block size; on the stack, not allocated.
        let mut head = Head([0u8; HEAD_BYTES]);
        let n = self
            .inner
            .readv(cx, &mut [IoSliceMut::new(&mut head.0)], 0)?;
        let sector = &mut head.0[..PROBE_BYTES];
        let mut n = n.min(PROBE_BYTES);
        match change {
            Change::Write(bufs, offset) => {
                let mut at = offset as usize;
                for buf in bufs {
                    if at >= PROBE_BYTES {
                        break;
                    }
                    let take = buf.len().min(PROBE_BYTES - at);
                    sector[at..at + take].copy_from_slice(&buf[..take]);
                    at += buf.len();
                }
                n = n.max(at.min(PROBE_BYTES));
            }
            Change::Zeroes(offset, len) => {
                let end = offset.saturating_add(len).min(PROBE_BYTES as u64) as usize;
                sector[offset as usize..end].fill(0);
                n = n.max(end);
            }
            Change::Resize(len) => n = n.min(len as usize),
        }
        if let Some(format) = foreign_format(&sector[..n]) {
            let count = self.refused.fetch_add(1, Ordering::Relaxed);
            let line = format!(
                "{}: refused a write that would make the first sector probe as {format} \
                 (the format was probed as raw; pass --format raw to lift this)",
                self.inner.describe()
            );
            // One warning; the rest at debug level, so a writer cannot flood the log.
            match count {
                0 => log::warn!("{line}"),
                _ => log::debug!("{line}"),
            }
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        op()
    }
}

impl BlockBackend for ProbedRaw {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.inner.readv(cx, bufs, offset)
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.guarded(cx, Change::Write(bufs, offset), || {
            self.inner.writev(cx, bufs, offset)
        })
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.inner.flush(cx)
    }

    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.inner.close(cx)
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.guarded(cx, Change::Zeroes(offset, len), || {
            self.inner.discard(cx, offset, len)
        })
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.guarded(cx, Change::Zeroes(offset, len), || {
            self.inner.write_zeroes(cx, offset, len, may_unmap)
        })
    }

    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.guarded(cx, Change::Resize(new_len), || {
            self.inner.resize(cx, new_len)
        })
    }

    fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        let bufs = [IoSlice::new(buf)];
        self.guarded(cx, Change::Write(&bufs, offset), || {
            self.inner.write_durable(cx, buf, offset)
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
        format!("{} (format probed: raw)", self.inner.describe())
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            probe_refused_writes: self.refused(),
            ..self.inner.stats()
        }
    }

    fn inject_stats(&self) -> Option<InjectStats> {
        self.inner.inject_stats()
    }

    fn open_warning(&self) -> Option<String> {
        Some(format!(
            "image {}: no --format given, and the probe found raw; writes that would make \
             its first sector probe as another format are refused (EPERM), as QEMU does; \
             pass --format raw to lift this",
            self.path.display()
        ))
    }

    // No `passthrough_file`: a mapping passed through to the file would write its first
    // sector unchecked.

    fn abort(&self) {
        self.inner.abort()
    }

    fn waits_are_bounded(&self) -> bool {
        self.inner.waits_are_bounded()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FileBackend, OpenOptions};

    fn guarded_image(contents: &[u8]) -> (tempfile::NamedTempFile, ProbedRaw) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        let opts = OpenOptions {
            writable: true,
            ..OpenOptions::default()
        };
        let raw = FileBackend::open(file.path(), &opts).unwrap();
        let disk = ProbedRaw::new(Arc::new(raw), file.path());
        (file, disk)
    }

    fn write(disk: &ProbedRaw, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let bufs: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        disk.writev(&Ctx::Blocking, &bufs, offset)
    }

    fn eperm(r: io::Result<()>) -> bool {
        r.is_err_and(|e| e.raw_os_error() == Some(libc::EPERM))
    }

    #[test]
    fn a_header_written_whole_or_in_pieces_is_refused_and_the_image_kept() {
        let (file, disk) = guarded_image(&[0u8; 4096]);
        assert!(eperm(write(&disk, &[b"QFI\xfb\0\0\0\x03"], 0)));
        // Split across iovecs, and across two writes.
        assert!(eperm(write(&disk, &[b"QF", b"I\xfb"], 0)));
        write(&disk, &[b"QFI"], 0).unwrap();
        assert!(eperm(write(&disk, &[b"\xfb"], 3)));
        // A VMDK descriptor a byte at a time, ending with its newline.
        let (_f2, vmdk) = guarded_image(&[0u8; 1024]);
        write(&vmdk, &[b"version=1"], 0).unwrap();
        assert!(eperm(write(&vmdk, &[b"\n"], 9)));
        assert_eq!(disk.refused(), 3);
        assert_eq!(disk.stats().probe_refused_writes, 3);
        let kept = std::fs::read(file.path()).unwrap();
        assert_eq!(&kept[..4], b"QFI\0", "only the harmless write landed");
    }

    #[test]
    fn ordinary_writes_and_ones_past_the_first_sector_pass() {
        let (file, disk) = guarded_image(&[0u8; 4096]);
        write(&disk, &[b"\xeb\x63\x90"], 0).unwrap();
        write(&disk, &[b"QFI\xfb"], 512).unwrap();
        let data = std::fs::read(file.path()).unwrap();
        assert_eq!(
            (&data[..3], &data[512..516]),
            (&b"\xeb\x63\x90"[..], &b"QFI\xfb"[..])
        );
    }

    #[test]
    fn zeroes_and_shrinking_that_leave_a_header_are_refused_others_pass() {
        // A VMDK magic already there (a raw disk may hold anything; corofuse probes only
        // qcow2): changes that keep it are refused, changes that remove it pass.
        let mut head = vec![0u8; 4096];
        head[..4].copy_from_slice(b"KDMV");
        let (_file, disk) = guarded_image(&head);
        let cx = Ctx::Blocking;
        assert!(eperm(disk.write_zeroes(&cx, 100, 100, false)));
        assert!(eperm(disk.resize(&cx, 200)));
        disk.write_zeroes(&cx, 0, 1, false).unwrap();
        assert_eq!(disk.len(), 4096);
    }
}
