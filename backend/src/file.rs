//! The raw image backend: one file (or block device) whose bytes are the disk, like QEMU's
//! `file` driver (block/file-posix.c).
//!
//! - Reads and writes go straight between the caller's iovecs and the file, retrying short
//!   transfers. With O_DIRECT, requests that break the alignment rules go through the
//!   bounce path in `direct.rs`.
//! - discard punches a hole (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`); write_zeroes
//!   tries the cheapest way that reads back as zeroes (see [`FileBackend`]); resize is
//!   `ftruncate`, so growing stays sparse.
//! - The size is cached in an atomic, updated by resize and by writes that extend.
//! - On request, the open takes QEMU's image locks (`file/lock.rs`), held until the backend
//!   is dropped, so QEMU's tools and other exports do not write the image meanwhile.
//!
//! # Concurrency
//! Any number of requests may run at once; nothing locks the whole image but a size change.
//! - The size lock ([`Serial`]) orders everything that changes the size: writes and
//!   write_zeroes that extend, resize, and O_DIRECT writes whose padded span passes the end
//!   (they grow the file until trimmed back). So the cached size is the file's, and an
//!   `ftruncate` (resize, a sparse extension, trimming a padded write) can never cut off
//!   another request's data.
//! - In O_DIRECT mode, block-range locks ([`RangeLocks`]) order each read-modify-write
//!   (a write that starts or ends inside a logical block) against the requests that touch
//!   the same blocks, and nothing else: modifications hold their blocks shared, an RMW
//!   holds them exclusively, and resize holds everything from the smaller size on
//!   exclusively. Aligned writes only register their span; they never wait for each other.
//! - Reads take nothing. Buffered mode has no RMW of ours (the page cache does it), so it
//!   takes no range lock either.
//!
//! Lock order: the size lock, then a range.
//!
//! [`Serial`]: crate::serial::Serial
//! [`RangeLocks`]: crate::range_lock::RangeLocks

use std::fs::{self, File};
use std::io::{self, IoSlice, IoSliceMut, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

mod lock;
mod zeroes;

pub use lock::{Holder, LockError};

use crate::direct::Direct;
use crate::range_lock::{Mode, RangeGuard, RangeLocks, Span};
use crate::serial::{Serial, SerialGuard};
use crate::{checked_end, iov, sys, BackendStats, BlockBackend, Ctx, Extent, OpenOptions};

/// A raw image file.
///
/// `write_zeroes` tries, in order: with `may_unmap`, a punched hole; `FALLOC_FL_ZERO_RANGE`;
/// without `may_unmap`, a punched hole then reallocated; and last, writing zeroes. A mode
/// the filesystem refuses with `EOPNOTSUPP` is not tried again on this image (tmpfs has no
/// `ZERO_RANGE`). The part past the end of the file is added by `fallocate(0)` (allocated)
/// or, with `may_unmap` or where that is refused, `ftruncate` (sparse).
pub struct FileBackend {
    file: File,
    path: PathBuf,
    len: AtomicU64,
    writable: bool,
    direct: Option<Direct>,
    serial: Serial,
    ranges: RangeLocks,
    can_zero_range: AtomicBool,
    can_punch: AtomicBool,
    can_allocate: AtomicBool,
    /// Buffered reads (and durable writes) run as blocking syscalls even in a coroutine
    /// (see `sys::is_tmpfs`): io_uring hands each one to a worker thread there. Measured: a
    /// 1 MiB write took ~1.5x longer through the worker, and the hand-off cost a 4 KiB read
    /// 1.6 µs of daemon CPU (26% of the request).
    inline_io: bool,
    /// Buffered writes run as blocking syscalls even in a coroutine, on every file system
    /// (see [`FileBackend::write_ctx`]).
    inline_writes: bool,
    /// The image is on a network or FUSE file system
    /// ([`BlockBackend::waits_are_bounded`] says no).
    remote: bool,
}

/// The smallest buffered read made with a blocking `preadv` on every file system
/// ([`FileBackend::read_ctx`]).
const INLINE_READ: usize = 256 << 10;

/// The size lock, if this request took it.
type Guard<'a> = Option<SerialGuard<'a>>;

/// What a modifying request holds while it runs: the size lock if it may change the size,
/// and in O_DIRECT mode its blocks.
struct Held<'a> {
    _size: Guard<'a>,
    _blocks: Option<RangeGuard<'a>>,
}

impl FileBackend {
    /// Opens the image at `path` and, with `opts.lock`, takes QEMU's image locks on it for
    /// as long as the backend lives (see `file/lock.rs`). Errors name the path: "cannot open
    /// image /x: No such file or directory (os error 2)"; a lock that another process holds
    /// is an error of kind `ResourceBusy` carrying a [`LockError`] that names it.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> io::Result<FileBackend> {
        Self::open_as(path.as_ref(), opts, false)
    }

    /// The backing file of a qcow2 image, already opened read-only and without `O_DIRECT`
    /// as `file` (named `path` in messages): `O_DIRECT` is added as `opts` say, and the locks
    /// QEMU takes on a backing file (`file/lock.rs`).
    pub(crate) fn from_backing(
        file: File,
        path: &Path,
        opts: &OpenOptions,
    ) -> io::Result<FileBackend> {
        let opts = OpenOptions {
            writable: false,
            ..opts.clone()
        };
        check_kind(&file).map_err(|e| open_error(path, e, &opts))?;
        if opts.direct {
            sys::set_direct(file.as_fd()).map_err(|e| open_error(path, e, &opts))?;
        }
        Self::from_file(file, path, &opts, true)
    }

    fn open_as(path: &Path, opts: &OpenOptions, backing: bool) -> io::Result<FileBackend> {
        let file = open_file(path, opts).map_err(|e| open_error(path, e, opts))?;
        Self::from_file(file, path, opts, backing)
    }

    fn from_file(
        file: File,
        path: &Path,
        opts: &OpenOptions,
        backing: bool,
    ) -> io::Result<FileBackend> {
        match (opts.lock, backing) {
            (false, _) => {}
            (true, false) => lock::lock(&file, path, opts.writable)?,
            (true, true) => lock::lock_backing(&file, path)?,
        }
        let len = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|e| open_error(path, e, opts))?;
        let direct = opts.direct.then(|| Direct::probe(&file));
        let inline_io = direct.is_none() && sys::is_tmpfs(&file);
        let inline_writes = direct.is_none();
        let remote = runtime::remote_file_system(file.as_fd()).is_some();
        Ok(FileBackend {
            file,
            path: path.to_owned(),
            len: AtomicU64::new(len),
            writable: opts.writable,
            direct,
            serial: Serial::default(),
            ranges: RangeLocks::default(),
            can_zero_range: AtomicBool::new(true),
            can_punch: AtomicBool::new(true),
            can_allocate: AtomicBool::new(true),
            inline_io,
            inline_writes,
            remote,
        })
    }

    /// O_DIRECT alignment in use as `(memory, offset)` bytes; `None` when buffered.
    pub fn dio_align(&self) -> Option<(usize, usize)> {
        self.direct.as_ref().map(|d| (d.mem, d.off))
    }

    /// Bounce buffers allocated so far (O_DIRECT); stops growing in steady state.
    pub fn bounce_buffers_allocated(&self) -> u64 {
        self.direct.as_ref().map_or(0, |d| d.pool.allocated())
    }

    /// Times a request waited for blocks that an overlapping request held (O_DIRECT).
    pub fn range_waits(&self) -> u64 {
        self.ranges.waits()
    }

    /// Holds the blocks of `[offset, end)` exclusively, as a stalled read-modify-write
    /// would, until the guard drops: for tests that show which requests wait for one.
    #[doc(hidden)]
    pub fn hold_blocks_for_test(&self, cx: &Ctx<'_>, offset: u64, end: u64) -> impl Drop + '_ {
        let span = self
            .direct
            .as_ref()
            .map_or(Span { start: offset, end }, |d| d.span(offset, end));
        self.ranges.lock(cx, span, Mode::Exclusive)
    }

    fn check_writable(&self) -> io::Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EROFS)),
        }
    }

    /// Writes all of `buf` at `offset` and makes it durable (with the size, if it grew)
    /// before returning, as `writev` then `flush` would, but without writing back the rest
    /// of the file's dirty pages: buffered, each transfer is a write with `RWF_DSYNC`; in
    /// O_DIRECT mode (no dirty pages), or where `RWF_DSYNC` is refused, `writev` and
    /// `fdatasync`. For small metadata writes that must be durable before something links
    /// them (qcow2 refcounts).
    pub(crate) fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_writable()?;
        let end = checked_end(offset, buf.len() as u64)?;
        if self.direct.is_some() || end == offset {
            self.writev(cx, &[IoSlice::new(buf)], offset)?;
            return self.flush(cx);
        }
        let _held = self.hold(cx, offset, end);
        let mut done = 0;
        while done < buf.len() {
            let (piece, pos) = (&buf[done..], offset + done as u64);
            let res = match self.io_ctx(cx) {
                Ctx::Coroutine(co) => {
                    crate::sys::ring_write_dsync(co, self.file.as_fd(), piece, pos)
                }
                Ctx::Blocking => crate::sys::pwrite_dsync(self.file.as_fd(), piece, pos),
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    // A kernel or file system without RWF_DSYNC: the plain way.
                    self.write_all(cx, &[IoSlice::new(piece)], pos)?;
                    drop(_held);
                    return self.flush(cx);
                }
                Err(e) => return Err(e),
            }
        }
        self.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    /// How a buffered transfer reaches the kernel: inline on tmpfs (see `inline_io`).
    fn io_ctx<'c>(&self, cx: &'c Ctx<'c>) -> &'c Ctx<'c> {
        if self.inline_io {
            &Ctx::Blocking
        } else {
            cx
        }
    }

    /// How a buffered read of `len` bytes reaches the kernel: inline on tmpfs (see
    /// `inline_io`), and a large one ([`INLINE_READ`] or more) inline on every file system.
    /// Through the ring, a buffered read the page cache does not yet hold completes piece
    /// by piece, the ring retrying it as each part arrives; a blocking `preadv` waits once
    /// for the readahead it starts. fio on a buffered ext4 image (issue 37, 4 rounds of 5
    /// s): sequential 1 MiB reads at qd4 8.4-8.9k IOPS at 147-155 us of daemon CPU per
    /// request, against 6.7-8.3k at 155-189 through the ring and 8.2-9.0k for
    /// `--dispatch threads:2`; random 1 MiB reads 5.6-6.0k against 5.2-5.8k. Small reads
    /// stay on the ring: a random 4 KiB read from the disk would hold its loop (all of
    /// them inline: 19k IOPS at qd64 against 48k).
    fn read_ctx<'c>(&self, cx: &'c Ctx<'c>, len: usize) -> &'c Ctx<'c> {
        if self.direct.is_none() && len >= INLINE_READ {
            &Ctx::Blocking
        } else {
            self.io_ctx(cx)
        }
    }

    /// How a buffered write reaches the kernel: a blocking `pwritev` on the calling thread
    /// (the loop, in a coroutine), on every file system. Through the ring, ext4 (like
    /// tmpfs: no asynchronous buffered writes) hands each one to an io-wq worker, which
    /// runs the writes of one file one at a time per ring; the hand-off cost more than the
    /// write. fio on a buffered ext4 image (issue 37, `benches/HISTORY.md`): sequential 1 MiB
    /// writes 188-205 µs of daemon CPU per request instead of 264-270, 4 KiB random writes
    /// at iodepth 64 13-16 µs instead of 21-30. The price: a write that waits (dirty page
    /// throttling, the journal) holds its loop meanwhile, as it holds a worker of
    /// `--dispatch threads`; the other loops go on serving.
    fn write_ctx<'c>(&self, cx: &'c Ctx<'c>) -> &'c Ctx<'c> {
        if self.inline_writes {
            &Ctx::Blocking
        } else {
            cx
        }
    }

    /// Takes the size lock if `needed` (see the module's concurrency rules).
    fn lock_if<'s>(&'s self, cx: &Ctx<'_>, needed: bool) -> Guard<'s> {
        needed.then(|| self.serial.lock(cx))
    }

    /// Takes what a write (or write_zeroes, which may fall back to writing) of
    /// `[offset, end)` needs (module docs): the size lock when its span ends past the size;
    /// in O_DIRECT mode its blocks, exclusively for a read-modify-write.
    fn hold<'s>(&'s self, cx: &Ctx<'_>, offset: u64, end: u64) -> Held<'s> {
        let span = self.direct.as_ref().map(|d| d.span(offset, end));
        let mode = match self.direct.as_ref().is_some_and(|d| d.is_rmw(offset, end)) {
            true => Mode::Exclusive,
            false => Mode::Shared,
        };
        let span_end = span.map_or(end, |s| s.end);
        loop {
            let size = self.lock_if(cx, span_end > self.len());
            let blocks = span.map(|span| self.ranges.lock(cx, span, mode));
            // Without the size lock, a resize may have shrunk the image while we waited for
            // the blocks: then this request changes the size too, and must hold that lock.
            if size.is_none() && span_end > self.len() {
                continue;
            }
            return Held {
                _size: size,
                _blocks: blocks,
            };
        }
    }

    /// One read attempt into `bufs` from logical byte `skip` on; 0 at end of file.
    fn read_some(
        &self,
        cx: &Ctx<'_>,
        bufs: &mut [IoSliceMut<'_>],
        skip: usize,
        pos: u64,
    ) -> io::Result<usize> {
        if let Some(d) = self.direct.as_ref().filter(|d| !d.fits(bufs, skip, pos)) {
            return d.read(cx, &self.file, bufs, skip, pos);
        }
        let cx = self.read_ctx(cx, iov::total(bufs) - skip);
        match iov::locate(bufs, skip) {
            (idx, 0) => cx.readv_at(&self.file, &mut bufs[idx..], pos),
            (idx, within) => cx.readv_at(
                &self.file,
                &mut [IoSliceMut::new(&mut bufs[idx][within..])],
                pos,
            ),
        }
    }

    /// One write attempt from `bufs` from logical byte `skip` on, where the whole request
    /// ends at `end`. The caller holds what [`FileBackend::hold`] gives.
    fn write_some(
        &self,
        cx: &Ctx<'_>,
        bufs: &[IoSlice<'_>],
        skip: usize,
        pos: u64,
        end: u64,
    ) -> io::Result<usize> {
        if let Some(d) = self.direct.as_ref().filter(|d| !d.fits(bufs, skip, pos)) {
            return d.write(cx, &self.file, bufs, skip, pos, self.len().max(end));
        }
        let cx = self.write_ctx(cx);
        match iov::locate(bufs, skip) {
            (idx, 0) => cx.writev_at(&self.file, &bufs[idx..], pos),
            (idx, within) => cx.writev_at(&self.file, &[IoSlice::new(&bufs[idx][within..])], pos),
        }
    }

    /// Writes all of `bufs` at `offset`; the caller holds what [`FileBackend::hold`] gives.
    fn write_all(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        let total = iov::total(bufs);
        let end = checked_end(offset, total as u64)?;
        let mut done = 0;
        while done < total {
            match self.write_some(cx, bufs, done, offset + done as u64, end)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => done += n,
            }
        }
        self.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }
}

fn open_file(path: &Path, opts: &OpenOptions) -> io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.read(true).write(opts.writable);
    if opts.direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = options.open(path)?;
    check_kind(&file)?;
    Ok(file)
}

/// An image is a regular file or a block device.
fn check_kind(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    if kind.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !kind.is_file() && !kind.is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file or block device",
        ));
    }
    Ok(())
}

/// "cannot open image PATH: ERROR", with a hint where there is an obvious next step.
fn open_error(path: &Path, e: io::Error, opts: &OpenOptions) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EINVAL) if opts.direct => {
            " (the filesystem may not support O_DIRECT: open without direct)"
        }
        Some(libc::EACCES | libc::EROFS | libc::EPERM) if opts.writable => " (open it read-only)",
        _ => "",
    };
    io::Error::new(
        e.kind(),
        format!("cannot open image {}: {e}{hint}", path.display()),
    )
}

impl BlockBackend for FileBackend {
    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        FileBackend::write_durable(self, cx, buf, offset)
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        let total = iov::total(bufs);
        checked_end(offset, total as u64)?;
        let mut done = 0;
        while done < total {
            match self.read_some(cx, bufs, done, offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.check_writable()?;
        let end = checked_end(offset, iov::total(bufs) as u64)?;
        if end == offset {
            return Ok(()); // nothing to write: must not extend
        }
        let _held = self.hold(cx, offset, end);
        self.write_all(cx, bufs, offset)
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        cx.fdatasync(&self.file)
    }

    /// Flushes, then drops the image's locks now rather than when the fd closes: the fd
    /// may outlive the export (an `Arc` held for `--stats`, FUSE passthrough's backing
    /// reference in the kernel), and the next export must not find the image locked.
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        let flushed = self.flush(cx);
        lock::release(&self.file).map_err(|e| {
            io::Error::new(e.kind(), format!("unlocking {}: {e}", self.path.display()))
        })?;
        flushed
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.check_writable()?;
        let end = checked_end(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // KEEP_SIZE: the blocks only, never the size.
        let blocks = self.direct.as_ref().map(|d| d.span(offset, end));
        let _blocks = blocks.map(|span| self.ranges.lock(cx, span, Mode::Shared));
        cx.fallocate(&self.file, zeroes::PUNCH, offset, len)
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.check_writable()?;
        let end = checked_end(offset, len)?;
        if len == 0 {
            return Ok(()); // nothing to zero: must not extend
        }
        let _held = self.hold(cx, offset, end);
        let size = self.len();
        if offset < size.min(end) {
            self.zero_inside(cx, offset, size.min(end) - offset, may_unmap)?;
        }
        if end > size {
            self.zero_extend(cx, offset.max(size), end, may_unmap)?;
        }
        self.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }

    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.check_writable()?;
        let _size = self.lock_if(cx, true);
        // Everything from the smaller size on: no RMW may write back a block there meanwhile.
        let _blocks = self.direct.as_ref().map(|d| {
            let start = d.block_start(self.len().min(new_len));
            self.ranges.lock(
                cx,
                Span {
                    start,
                    end: u64::MAX,
                },
                Mode::Exclusive,
            )
        });
        cx.ftruncate(&self.file, new_len)?;
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    fn block_status(&self, _cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        let len = self.len();
        if offset >= len {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        loop {
            let data = match sys::lseek(self.file.as_fd(), offset, libc::SEEK_DATA) {
                Ok(data) => data,
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(Extent::hole(len)),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    return Ok(Extent::data(len)); // no SEEK_DATA here: all data
                }
                Err(e) => return Err(e),
            };
            if data > offset {
                return Ok(Extent::hole(data.min(len)));
            }
            let hole = sys::lseek(self.file.as_fd(), offset, libc::SEEK_HOLE)?;
            if hole > offset {
                return Ok(Extent::data(hole.min(len)));
            } // else: the data became a hole between the two calls; ask again
        }
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.blocks() * 512)
    }

    fn read_only(&self) -> bool {
        !self.writable
    }

    fn describe(&self) -> String {
        let mode = match &self.direct {
            Some(d) if d.reported => format!("direct, alignment {}/{}", d.mem, d.off),
            Some(d) => format!("direct, alignment {}/{} assumed", d.mem, d.off),
            None => "buffered".to_owned(),
        };
        let ro = if self.writable { "" } else { ", read-only" };
        format!("file:{} ({mode}{ro})", self.path.display())
    }

    fn passthrough_file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.file.as_fd())
    }

    fn waits_are_bounded(&self) -> bool {
        !self.remote
    }

    fn stats(&self) -> BackendStats {
        let count = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let direct = self.direct.as_ref();
        BackendStats {
            bounced_reads: direct.map_or(0, |d| count(&d.bounced_reads)),
            bounced_writes: direct.map_or(0, |d| count(&d.bounced_writes)),
            rmw_writes: direct.map_or(0, |d| count(&d.rmw_writes)),
            bounce_buffers_allocated: self.bounce_buffers_allocated(),
            range_waits: self.ranges.waits(),
            direct_syscalls: 0,
            probe_refused_writes: 0,
        }
    }
}
