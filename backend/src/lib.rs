//! corofuse's block backends: what the exported file's bytes are stored in.
//!
//! A backend is one object behind [`BlockBackend`], shared by every request. Each call takes
//! a [`Ctx`] that says how to reach the kernel: through the io_uring of the calling
//! coroutine ([`Ctx::Coroutine`]), or with blocking syscalls ([`Ctx::Blocking`], inline on
//! the loop or on worker threads). So one backend serves every dispatch mode, and it is
//! `Send + Sync` for the threads.
//!
//! [`open`] turns a spec into a backend: `null:SIZE` ([`NullBackend`]) or a path to a raw
//! image ([`FileBackend`]) or a qcow2 image ([`Qcow2Backend`], found by its magic), or an
//! NBD URI ([`NbdBackend`]: `nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`).
//!
//! ```
//! use std::io::IoSliceMut;
//! use backend::{BlockBackend, Ctx, OpenOptions};
//!
//! let disk = backend::open("null:1M", &OpenOptions::default())?;
//! let (mut head, mut tail) = ([1u8; 512], [1u8; 512]);
//! let mut bufs = [IoSliceMut::new(&mut head), IoSliceMut::new(&mut tail)];
//! // 1000 bytes are left before the end: the read is short.
//! let n = disk.readv(&Ctx::Blocking, &mut bufs, (1 << 20) - 1000)?;
//! assert_eq!(disk.describe(), "null:1048576 (reads zeroes, drops writes, read-only)");
//! assert_eq!((n, head[0], tail[487], tail[488]), (1000, 0, 0, 1));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Contract for every backend
//! - Transfers use the caller's iovecs in place, with no copy (except O_DIRECT bounces).
//! - [`BlockBackend::readv`] fills the buffers completely unless the image ends first; then
//!   it returns the bytes read (short) and leaves the rest of the buffers untouched.
//! - [`BlockBackend::writev`] writes everything or fails; a write past the end extends a
//!   file image. Nothing is silently dropped (except by the null backend, on purpose).
//! - Checking requests against the size is the export's job; the backend reports what the
//!   storage says. A read-only backend fails every modification with `EROFS`.
//! - Errors are [`io::Error`]s carrying the errno to reply with.
//!
//! Layout: `qcow2` (QEMU's image format over a `file`: header, L2 cache, refcounts,
//! allocation, compression, backing files, one file each); `file` (with its write_zeroes strategy in `file/zeroes` and QEMU's image locks
//! in `file/lock`), `null` and `nbd` (a client of an NBD server: URI, handshake, wire
//! format, replies, connection), one backend each; `inject` (a wrapper that fails or delays
//! chosen operations: `--inject`); `record` (a wrapper that logs every modification and
//! flush: `--record-writes`) and `crash` (crash states built from such a log, checked);
//! `direct` and `pool`
//! (O_DIRECT alignment and bounce buffers); `serial` (the size lock, for every context) and `range_lock` (block
//! ranges, so that an O_DIRECT read-modify-write waits only for requests on its blocks);
//! `iov` (iovec helpers); `sys` (all the unsafe code: raw syscalls).
#![warn(missing_docs)]

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;

mod aligned;
pub mod crash;
mod direct;
mod file;
pub mod inject;
mod iov;
pub mod nbd;
mod null;
mod pool;
pub mod probe;
mod probed_raw;
mod qcow2;
mod range_lock;
pub mod record;
mod serial;
mod sys;

pub use aligned::{AlignedBuf, PAGE_ALIGN};
pub use file::{FileBackend, Holder, LockError};
pub use inject::{InjectBackend, InjectStats};
pub use nbd::{NbdBackend, NbdOptions};
pub use null::{parse_size, NullBackend, SizeError};
pub use probed_raw::ProbedRaw;
pub use qcow2::{Qcow2Backend, SnapshotInfo};
/// The context every backend call runs in; it lives in the runtime, beside [`runtime::Co`].
pub use runtime::Ctx;
pub use sys::IOV_MAX;

/// Storage for the exported file. Object safe: used as `Arc<dyn BlockBackend>`.
pub trait BlockBackend: Send + Sync {
    /// Current size in bytes, exact (not rounded to sectors).
    fn len(&self) -> u64;

    /// Whether the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads into `bufs` at `offset`. Returns the bytes read: all of them, unless the image
    /// ends first (then fewer, 0 at or past the end; the rest of `bufs` is untouched).
    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize>;

    /// Writes all of `bufs` at `offset`, retrying short writes, or fails. After an error some
    /// of the bytes may have been written.
    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()>;

    /// Makes completed writes durable (`fdatasync`).
    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()>;

    /// Deallocates `[offset, offset + len)`, which then reads as zeroes; the size is kept.
    /// `EOPNOTSUPP` if the storage cannot.
    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()>;

    /// Makes `[offset, offset + len)` read as zeroes, growing the image if it ends past the
    /// end. `may_unmap` allows deallocating the range; without it the range stays (or
    /// becomes) allocated where the storage can.
    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()>;

    /// Sets the size; growing adds a hole that reads as zeroes.
    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()>;

    /// Writes all of `buf` at `offset`, durable on return: for small metadata writes that
    /// must reach stable storage before something links them (qcow2 refcounts). By
    /// default a write and a [`flush`](BlockBackend::flush); a file makes it one
    /// `RWF_DSYNC` write.
    fn write_durable(&self, cx: &Ctx<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writev(cx, &[IoSlice::new(buf)], offset)?;
        self.flush(cx)
    }

    /// What `offset` lies in (data or hole) and where that run ends (at most [`len`]), for
    /// `SEEK_DATA`/`SEEK_HOLE`. `ENXIO` at or past the end, like `lseek`.
    ///
    /// [`len`]: BlockBackend::len
    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent>;

    /// Bytes of storage in use (for `st_blocks`).
    fn allocated_bytes(&self) -> io::Result<u64>;

    /// Whether modifications fail with `EROFS`.
    fn read_only(&self) -> bool;

    /// One line for logs, e.g. "file:/img (direct, alignment 512/512)".
    fn describe(&self) -> String;

    /// What the backend did beyond plain transfers (zero where it never does such things).
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    /// What fault injection did, for a backend wrapped in an [`InjectBackend`].
    fn inject_stats(&self) -> Option<InjectStats> {
        None
    }

    /// A warning to show once the export is live, about how the image was opened (a
    /// format that was probed, not given); `None` for most backends. Shown after the
    /// mount, so that a setup error stays one line.
    fn open_warning(&self) -> Option<String> {
        None
    }

    /// Whether every wait of this backend's I/O is on local storage, bounded: not on
    /// another machine (NBD, an image on NFS) or another FUSE server, which may stall for
    /// as long as they like. Only then may a request be served with blocking calls on its
    /// loop's thread, holding the loop (`--idle-wait block`). `false` by default; a backend
    /// over another says what that one says.
    fn waits_are_bounded(&self) -> bool {
        false
    }

    /// The file whose bytes are the exported bytes one for one, where there is one (a raw
    /// image file): FUSE passthrough may send reads straight to it. `None` for every
    /// backend that maps or changes the bytes (qcow2, null, fault injection).
    fn passthrough_file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// Ends the export's use of the image, after its last request: the closing writes done
    /// and durable, and the image's locks released, so that the next opener (a new export
    /// started the moment this one's mount is gone) finds it free. Nothing is read or
    /// written through the backend after it. By default a [`flush`](BlockBackend::flush).
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.flush(cx)
    }

    /// Gives up on what waits for something outside this process: requests waiting for an
    /// NBD server fail with `EIO` now, and every later one at once. For a daemon told to
    /// stop while its server no longer answers. Local storage finishes by itself: nothing
    /// to do (the default).
    fn abort(&self) {}

    /// Makes an internal snapshot named `name` of the disk as it is now, while it serves
    /// (QMP `blockdev-snapshot-internal-sync`): qcow2 only, `ENOTSUP` by default. Errors:
    /// `EROFS` read-only; `InvalidInput` "Name is empty"; `AlreadyExists` "Snapshot with
    /// name 'N' already exists" (QMP adds " on device 'D'").
    fn snapshot_create(&self, cx: &Ctx<'_>, name: &str) -> io::Result<SnapshotInfo> {
        let _ = (cx, name);
        Err(io::Error::from_raw_os_error(libc::ENOTSUP))
    }

    /// Deletes the internal snapshot with ID `id` and/or name `name` (both must match when
    /// both are given; QMP `blockdev-snapshot-delete-internal-sync`) and returns what it
    /// was: qcow2 only, `ENOTSUP` by default. Errors: `InvalidInput` "Name or id must be
    /// provided"; `NotFound` "Snapshot with id 'I' and name 'N' does not exist" (a missing
    /// one is 'null'; QMP adds " on device 'D'"); `PermissionDenied` "Failed to remove
    /// snapshot from snapshot list: Operation not permitted" (read-only, as qsd says it).
    fn snapshot_delete(
        &self,
        cx: &Ctx<'_>,
        id: Option<&str>,
        name: Option<&str>,
    ) -> io::Result<SnapshotInfo> {
        let _ = (cx, id, name);
        Err(io::Error::from_raw_os_error(libc::ENOTSUP))
    }
}

/// The costly paths a backend took, for `--stats`: each is a copy, an extra read or a wait
/// that plain transfers do not pay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackendStats {
    /// O_DIRECT reads that went through a bounce buffer (unaligned offset, length or memory).
    pub bounced_reads: u64,
    /// O_DIRECT writes copied to a bounce buffer only because their memory was unaligned.
    pub bounced_writes: u64,
    /// O_DIRECT read-modify-writes: writes that start or end inside a logical block.
    pub rmw_writes: u64,
    /// Bounce buffers allocated (stops growing in steady state).
    pub bounce_buffers_allocated: u64,
    /// Times a request waited for blocks that an overlapping request held.
    pub range_waits: u64,
    /// System calls made outside the loop's ring on a coroutine's behalf (an NBD command
    /// sent at once with `sendmsg`), to add to the ring's `io_uring_enter` calls.
    pub direct_syscalls: u64,
    /// Modifications of the first sector of a raw image whose format was probed, refused
    /// because the sector would then probe as another format ([`ProbedRaw`]).
    #[serde(default)]
    pub probe_refused_writes: u64,
}

/// Whether a run of bytes is stored data or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentKind {
    /// Allocated: may hold anything.
    Data,
    /// Not allocated: reads as zeroes.
    Hole,
}

/// A run of one [`ExtentKind`] from the queried offset up to `end` (exclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Data or hole.
    pub kind: ExtentKind,
    /// First byte past the run; at most the image size.
    pub end: u64,
}

impl Extent {
    /// Data up to `end`.
    pub fn data(end: u64) -> Extent {
        Extent {
            kind: ExtentKind::Data,
            end,
        }
    }

    /// A hole up to `end`.
    pub fn hole(end: u64) -> Extent {
        Extent {
            kind: ExtentKind::Hole,
            end,
        }
    }
}

/// How to open an image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for writing (else modifications fail with `EROFS`).
    pub writable: bool,
    /// Bypass the page cache (`O_DIRECT`); file images only.
    pub direct: bool,
    /// Take QEMU's image locks (block/file-posix.c's lock bytes) on a file image, as a
    /// QEMU writer that shares only consistent reads or as a QEMU reader, and refuse the
    /// image if another process's locks conflict ([`LockError`]). Off: QEMU's
    /// `locking=off`. The null backend takes none. A qcow2 image's backing files get a
    /// QEMU reader's locks.
    pub lock: bool,
    /// How to read a file image: by its magic ([`Format::Auto`]), or as forced.
    pub format: Format,
    /// Export this internal snapshot of a qcow2 image (its ID, else its name), read-only,
    /// instead of the active state (`qemu-nbd -l`).
    pub snapshot: Option<String>,
}

/// The format of a file image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// qcow2 if the file starts with the qcow2 magic, else raw.
    #[default]
    Auto,
    /// The file's bytes are the disk, whatever they start with.
    Raw,
    /// A qcow2 image ([`Qcow2Backend`]); anything else is refused.
    Qcow2,
}

/// Opens a backend from a spec: `null:SIZE` (e.g. `null:1G`, see [`parse_size`]) or the
/// path of an image, optionally written `file:PATH` (for paths that start with `null:`).
/// A file image is qcow2 if it starts with the qcow2 magic, else raw; `opts.format`
/// forces either (a raw image that starts with the magic is exported raw only so).
///
/// Errors are one line naming what failed: "cannot open image /x: No such file or
/// directory (os error 2)", "invalid image spec \"null:1X\": ...".
pub fn open(spec: &str, opts: &OpenOptions) -> io::Result<Arc<dyn BlockBackend>> {
    open_with_log(spec, opts, None)
}

/// [`open`], recording in `log` every modification and flush that reaches the storage
/// (for qcow2: the image file under the qcow2 layer) and, for a qcow2 image, what the
/// qcow2 layer is asked: see [`record`]. Backing files are read-only, so not recorded.
pub fn open_recorded(
    spec: &str,
    opts: &OpenOptions,
    log: &Arc<record::WriteLog>,
) -> io::Result<Arc<dyn BlockBackend>> {
    open_with_log(spec, opts, Some(log))
}

fn open_with_log(
    spec: &str,
    opts: &OpenOptions,
    log: Option<&Arc<record::WriteLog>>,
) -> io::Result<Arc<dyn BlockBackend>> {
    use record::{Level, RecordBackend};
    if let Some(size) = spec.strip_prefix("null:") {
        if opts.snapshot.is_some() {
            return Err(invalid_spec(spec, "the null backend has no snapshots"));
        }
        let len = parse_size(size).map_err(|e| invalid_spec(spec, &e.to_string()))?;
        let null = Arc::new(NullBackend::new(len, opts.writable));
        return Ok(RecordBackend::wrap(null, log, Level::Image));
    }
    if spec == "null" {
        return Err(invalid_spec(
            spec,
            "the null backend needs a size, e.g. null:1G",
        ));
    }
    if nbd::is_nbd(spec) {
        return nbd::open_image_recorded(spec, opts, &NbdOptions::default(), log);
    }
    match spec.strip_prefix("file:").unwrap_or(spec) {
        "" => Err(invalid_spec(
            spec,
            "give a path, or null:SIZE (e.g. null:1G)",
        )),
        path => qcow2::open_image(std::path::Path::new(path), opts, log),
    }
}

fn invalid_spec(spec: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("invalid image spec {spec:?}: {why}"),
    )
}

/// `offset + len`, or `EINVAL` past the largest file offset (`i64::MAX`).
pub(crate) fn checked_end(offset: u64, len: u64) -> io::Result<u64> {
    offset
        .checked_add(len)
        .filter(|&end| end <= i64::MAX as u64)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}
