//! write_zeroes for [`FileBackend`]: the cheapest way that reads back as zeroes, in the
//! order QEMU's file-posix driver tries them (see [`FileBackend`]'s docs), remembering which
//! `fallocate` modes the filesystem refuses.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicBool, Ordering};

use libc::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};

use super::FileBackend;
use crate::{iov, BlockBackend, Ctx};

/// Deallocate, keep the size: discard, and write_zeroes where unmapping is allowed.
pub(super) const PUNCH: i32 = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;

/// Zeroes that the write-zeroes fallback writes from, aligned for O_DIRECT.
#[repr(C, align(4096))]
struct Zeroes([u8; 64 * 1024]);
static ZEROES: Zeroes = Zeroes([0; 64 * 1024]);

impl FileBackend {
    /// `fallocate(mode)`; `Ok(false)` if the filesystem refuses the mode (`EOPNOTSUPP`,
    /// remembered in `cap`) or this range (`EINVAL`, as some filesystems do for unaligned
    /// ranges).
    fn try_fallocate(
        &self,
        cx: &Ctx<'_>,
        cap: &AtomicBool,
        mode: i32,
        off: u64,
        len: u64,
    ) -> io::Result<bool> {
        if !cap.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match cx.fallocate(&self.file, mode, off, len) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                log::debug!(
                    "{}: fallocate mode {mode:#x} unsupported, not trying again",
                    self.describe()
                );
                cap.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Zeroes `[off, off + len)`, all inside the file (see [`FileBackend`]'s order).
    pub(super) fn zero_inside(
        &self,
        cx: &Ctx<'_>,
        off: u64,
        len: u64,
        may_unmap: bool,
    ) -> io::Result<()> {
        if may_unmap && self.try_fallocate(cx, &self.can_punch, PUNCH, off, len)? {
            return Ok(());
        }
        let zero_range = FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
        if self.try_fallocate(cx, &self.can_zero_range, zero_range, off, len)? {
            return Ok(());
        }
        if !may_unmap && self.try_fallocate(cx, &self.can_punch, PUNCH, off, len)? {
            return self.reallocate(cx, off, len);
        }
        self.write_zero_bytes(cx, off, len)
    }

    /// Allocates a range just punched; the zeroes are already there, so failing to
    /// allocate them is not an error.
    fn reallocate(&self, cx: &Ctx<'_>, off: u64, len: u64) -> io::Result<()> {
        if let Err(e) = cx.fallocate(&self.file, FALLOC_FL_KEEP_SIZE, off, len) {
            log::debug!("{}: reallocating zeroed range: {e}", self.describe());
        }
        Ok(())
    }

    /// Grows the file from `from` (at or past its end) to `end`, reading as zeroes.
    pub(super) fn zero_extend(
        &self,
        cx: &Ctx<'_>,
        from: u64,
        end: u64,
        may_unmap: bool,
    ) -> io::Result<()> {
        if !may_unmap && self.try_fallocate(cx, &self.can_allocate, 0, from, end - from)? {
            return Ok(());
        }
        cx.ftruncate(&self.file, end)
    }

    /// The last resort: writes zero bytes, up to 1 MiB per call, with no allocation. The
    /// caller holds the range exclusively if it is unaligned (the edges are RMWs).
    fn write_zero_bytes(&self, cx: &Ctx<'_>, mut off: u64, len: u64) -> io::Result<()> {
        let end = off + len;
        let zeroes = &ZEROES.0[..];
        let mut iov = [IoSlice::new(&[]); 16];
        while off < end {
            let mut n = (end - off).min((iov.len() * zeroes.len()) as u64) as usize;
            let used = n.div_ceil(zeroes.len());
            for slot in &mut iov[..used] {
                *slot = IoSlice::new(&zeroes[..n.min(zeroes.len())]);
                n -= slot.len();
            }
            self.write_all(cx, &iov[..used], off)?;
            off += iov::total(&iov[..used]) as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::atomic::Ordering;

    use crate::{BlockBackend, Ctx, FileBackend, OpenOptions};

    /// Zeroes `[100, 100 + 3 MiB + 5)` of a 2 MiB image with every fallocate mode refused,
    /// so only writing zero bytes is left (partly past the end, which grows the file).
    fn write_bytes_fallback(cx: &Ctx<'_>, direct: bool) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fallback.img");
        fs::write(&path, vec![7u8; 2 << 20]).unwrap();
        let b = FileBackend::open(
            &path,
            &OpenOptions {
                writable: true,
                direct,
                lock: false,
                format: crate::Format::Auto,
                snapshot: None,
            },
        )
        .unwrap();
        for cap in [&b.can_zero_range, &b.can_punch, &b.can_allocate] {
            cap.store(false, Ordering::Relaxed);
        }
        let len = (3 << 20) + 5;
        b.write_zeroes(cx, 100, len, false).unwrap();
        let data = fs::read(&path).unwrap();
        assert_eq!((b.len(), data.len() as u64), (100 + len, 100 + len));
        assert!(data[..100].iter().all(|&v| v == 7) && data[100..].iter().all(|&v| v == 0));
    }

    #[test]
    fn writes_zero_bytes_when_fallocate_is_refused() {
        for direct in [false, true] {
            write_bytes_fallback(&Ctx::Blocking, direct);
            let rt = runtime::Runtime::new(runtime::Config::default()).unwrap();
            rt.block_on(move |co| write_bytes_fallback(&Ctx::Coroutine(co), direct))
                .unwrap();
        }
    }
}
