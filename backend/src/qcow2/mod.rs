//! The qcow2 backend: QEMU's image format (versions 2 and 3), served as the raw disk it
//! holds, like QEMU's `qcow2` driver (block/qcow2*.c).
//!
//! # Why hand-written
//! The `qcow2-rs` crate (0.1.6, ublk-org) was evaluated first. It is built on async/await:
//! its I/O trait (`Qcow2IoOps`) is a set of `async fn`s, its metadata sits behind
//! `futures-locks` async locks whose waiters need a `Waker`-driven executor, and it pulls
//! in tokio and tokio-uring. corofuse has no futures executor: its requests are stackful
//! coroutines whose I/O goes through [`Ctx`] (the loop's io_uring, or blocking syscalls on
//! threads), and the backend must be `Send + Sync` for worker threads, which its `?Send`
//! futures are not. Driving it would take an executor per request plus a waker bridge into
//! our loop, and it allocates per request (`HashMap`s, `Qcow2IoBuf`s); it has no zstd. So
//! the format is written here from QEMU's docs/interop/qcow2.txt.
//!
//! # What is served
//! - Reads: L1 in memory, L2 tables through a bounded cache ([`l2_cache`]); unallocated
//!   clusters read from the backing file (raw or qcow2, [`backing`]) or as zeroes; v3 zero
//!   clusters; compressed clusters (deflate, zstd: [`compress`]).
//! - Writes: in place where the cluster is allocated with refcount 1; otherwise a new
//!   cluster ([`alloc`], crash-safe order) filled with the old contents (backing file,
//!   zeroes, decompressed data) around the new bytes, then the L2 entry. write_zeroes and
//!   discard set v3 zero clusters or deallocate (`zero.rs`); an L2 table of the image's
//!   own that a request held whole and left mapping nothing is unlinked and freed. The L2
//!   entry of a copied-on-write cluster waits for the next flush (`deferred.rs`). Flush
//!   syncs the file, writes those entries, syncs again, then frees the clusters unlinked
//!   before it.
//! - Internal snapshots (`snapshot.rs`): the active state is served, and clusters and L2
//!   tables that snapshots share (refcount above one, no COPIED bit) are copied before
//!   they change (`write.rs`); or, with [`OpenOptions::snapshot`], one snapshot's L1
//!   table is served read-only instead. Snapshots are made and deleted while the image
//!   serves (`snapshot_edit.rs`: QMP's `blockdev-snapshot-internal-sync` and
//!   `blockdev-snapshot-delete-internal-sync`).
//! - Refused at open, one line naming the feature: encryption, external data files,
//!   extended L2 entries, unknown incompatible features. An image marked corrupt opens
//!   read-only only. A dirty image (refcounts not written back: QEMU with lazy refcounts,
//!   or a killed corofuse) opened for writing is repaired first, as QEMU repairs it
//!   (`repair.rs`: refcounts recounted, leaks reclaimed, OFLAG_COPIED made right, one log
//!   line); one whose tables contradict each other is refused with the reason. Read-only,
//!   a dirty image is read as it is. Unknown autoclear bits (and the bitmaps bit: corofuse
//!   does not update bitmaps) are cleared when the image is opened for writing, as the
//!   spec requires.
//! - The DIRTY bit while writable (v3): set at open and cleared at a clean close (drop),
//!   after the last sync, so that the clusters a killed corofuse leaks (its reservation,
//!   up to 384 MiB: `alloc.rs`) are reclaimed at the next writable open, ours or QEMU's.
//!   v2 images have no such bit: their leaks stay until `qemu-img check -r leaks`.
//! - Size: `resize` grows the virtual size, moving the L1 table where it must, and
//!   refuses what QEMU refuses (`resize.rs`): shrinking, sizes that are not whole
//!   sectors. Growable exports work as for raw images: a write or write_zeroes past the
//!   end first grows the disk to the end of the request rounded up to 512 bytes (qcow2
//!   sizes are whole sectors), so a growable export's size can be up to 511 bytes past
//!   the last byte written.
//!
//! # Concurrency
//! No lock covers the image. Each request holds the guest clusters it touches in a
//! [`RangeLocks`] (in guest cluster units): reads and in-place writes shared, requests that
//! change a mapping (allocating writes, zeroing, discard) exclusively; so two requests on
//! one cluster are ordered, and requests on other clusters never wait. A missing L2 table
//! is made under a lock on its L1 entry only. The allocator serializes itself, but data
//! I/O never runs under it. Waiting never blocks a loop: coroutines nap on the ring.
//!
//! Lock order: guest clusters, then an L1 entry, then the allocator.

use std::io::{self, IoSlice, IoSliceMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

mod alloc;
mod backing;
mod compress;
mod deferred;
mod entry;
mod header;
mod hostio;
mod l1;
mod l2_cache;
mod read;
mod rebuild;
mod refcount;
mod reftable;
mod repair;
mod resize;
mod snapshot;
mod snapshot_edit;
mod tally;
mod write;
mod zero;

use crate::pool::BouncePool;
use crate::range_lock::{Mode, RangeGuard, RangeLocks, Span};
use crate::record::{Level, RecordBackend, WriteLog};
use crate::{BlockBackend, Ctx, Extent, FileBackend, Format, OpenOptions, ProbedRaw};

use alloc::Allocator;
use compress::Decompressor;
use entry::Mapping;
use header::Header;
use hostio::Host;
use l2_cache::L2Cache;

pub(crate) use header::MAGIC;
pub use snapshot::SnapshotInfo;

/// A qcow2 image.
pub struct Qcow2Backend {
    host: Host,
    path: PathBuf,
    h: Header,
    /// Virtual size.
    size: AtomicU64,
    l1: l1::L1,
    l2: L2Cache,
    /// Writes the L2 entries that wait for a flush.
    write_back: deferred::WriteBack,
    /// Guest clusters held by requests.
    clusters: RangeLocks,
    /// L1 entries whose L2 table is being made.
    l1_locks: RangeLocks,
    /// `None` when read-only.
    alloc: Option<Allocator>,
    backing: Option<Arc<dyn BlockBackend>>,
    /// Internal snapshots in the image.
    snapshots: AtomicUsize,
    /// Where the snapshot table is now (changed only with every cluster held).
    table: Mutex<snapshot_edit::TableAt>,
    /// The snapshot exported instead of the active state (`--snapshot`).
    shown: Option<snapshot::Snapshot>,
    decompressor: Decompressor,
    /// Cluster-sized buffers (copy-on-write, decompressed clusters).
    bufs: BouncePool,
    /// Buffers for compressed input (up to two clusters).
    zbufs: BouncePool,
    writable: bool,
    /// Damaged tables met while serving (see `corrupt`).
    corrupt_seen: AtomicU64,
    /// The closing writes have run ([`BlockBackend::close`], or Drop).
    closed: AtomicBool,
}

/// Opens the image at `path` as `opts.format` says, probing the magic for
/// [`Format::Auto`]. A probed raw image opened for writing is a [`ProbedRaw`]: its first
/// sector can never be made to probe as another format. A probed qcow2 image's backing
/// file is not followed (`backing.rs`). With `log`, what reaches the file is recorded in
/// it, and for a qcow2 image what the qcow2 layer is asked too ([`crate::record`]).
pub(crate) fn open_image(
    path: &Path,
    opts: &OpenOptions,
    log: Option<&Arc<WriteLog>>,
) -> io::Result<Arc<dyn BlockBackend>> {
    let file = FileBackend::open(path, opts)?;
    let qcow2 = match opts.format {
        Format::Raw => false,
        Format::Qcow2 => true,
        Format::Auto => starts_with_magic(path),
    };
    if !qcow2 && opts.snapshot.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cannot open image {}: it is not qcow2, so it has no snapshots",
                path.display()
            ),
        ));
    }
    let recorded = |file: FileBackend| RecordBackend::wrap(Arc::new(file), log, Level::Image);
    match (qcow2, opts.format, opts.writable) {
        (true, ..) => open_qcow2(file, path, opts, 0, log),
        (false, Format::Auto, true) => Ok(Arc::new(ProbedRaw::new(recorded(file), path))),
        (false, ..) => Ok(recorded(file)),
    }
}

/// The qcow2 image in `file`, at `depth` in its backing chain (0: the exported image);
/// with `log`, recorded under the qcow2 layer and above it.
fn open_qcow2(
    file: FileBackend,
    path: &Path,
    opts: &OpenOptions,
    depth: u32,
    log: Option<&Arc<WriteLog>>,
) -> io::Result<Arc<dyn BlockBackend>> {
    let file = RecordBackend::wrap(Arc::new(file), log, Level::Image);
    let disk = Qcow2Backend::open_on(file, path, opts, depth, false).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot open image {}: {e}", path.display()),
        )
    })?;
    Ok(RecordBackend::wrap(Arc::new(disk), log, Level::Guest))
}

/// Whether the file at `path` starts with the qcow2 magic. Read through a plain fd of its
/// own, so that the probe is never an O_DIRECT bounce of the image's backend; a file too
/// short or unreadable here is left to the raw backend, which opened it already.
fn starts_with_magic(path: &Path) -> bool {
    std::fs::File::open(path).is_ok_and(|f| file_starts_with_magic(&f))
}

/// Whether `file` starts with the qcow2 magic.
fn file_starts_with_magic(file: &std::fs::File) -> bool {
    let mut magic = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(file, &mut magic, 0).is_ok_and(|()| magic == MAGIC)
}

/// Opens the qcow2 image that `file` holds (an NBD export), named `name` in messages. No
/// backing file: it would be found relative to a URI.
pub(crate) fn open_on_backend(
    file: Arc<dyn BlockBackend>,
    name: &str,
    opts: &OpenOptions,
) -> io::Result<Arc<dyn BlockBackend>> {
    let disk = Qcow2Backend::open_on(file, Path::new(name), opts, 0, true)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open image {name}: {e}")))?;
    Ok(Arc::new(disk))
}

impl Qcow2Backend {
    /// `remote`: `file` is not a local file, so no backing file is looked for beside it.
    fn open_on(
        file: Arc<dyn BlockBackend>,
        path: &Path,
        opts: &OpenOptions,
        depth: u32,
        remote: bool,
    ) -> io::Result<Qcow2Backend> {
        let cx = Ctx::Blocking;
        let host = Host { file };
        let mut head = [0u8; 512];
        host.read_padded(&cx, &mut head, 0)?;
        let mut first = vec![0u8; 1 << Header::cluster_bits_of(&head)?];
        host.read_padded(&cx, &mut first, 0)?;
        let mut h = Header::parse(&first, opts.writable)?;
        h.check_ranges(host.file.len())?;
        let (snapshots, snapshot_bytes) = snapshot::read_table(&cx, &host, &h)?;
        let (l1_offset, l1_size, size, shown) = match &opts.snapshot {
            None => (h.l1_table_offset, h.l1_size, h.size, None),
            Some(_) if opts.writable => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a snapshot is exported read-only (drop --writable)",
                ))
            }
            // The image's size, not the snapshot's own: QEMU's `qemu-nbd -l` and `qemu-img
            // convert -l` load the snapshot's L1 table alone, and what lies past it reads
            // as unallocated.
            Some(key) => {
                let s = snapshot::find(&snapshots, key)?;
                (s.l1_table_offset, s.l1_size, h.size, Some(s.clone()))
            }
        };
        // Before the first write, but after a dirty image's check (which may refuse it).
        let mut autoclear = opts.writable && h.autoclear != 0;
        let mut clear_autoclear = || -> io::Result<()> {
            if std::mem::take(&mut autoclear) {
                host.write_u64(&cx, 0, header::AUTOCLEAR_FIELD)?;
                host.file.flush(&cx)?;
            }
            Ok(())
        };
        if opts.writable && h.incompatible & header::DIRTY != 0 {
            let (s, n) = (&snapshots, snapshot_bytes);
            repair::repair(&cx, &host, &mut h, s, n, path, &mut clear_autoclear)?;
            h.incompatible &= !header::DIRTY; // on disk, until a clean close
        }
        clear_autoclear()?;
        let mut raw = vec![0u8; l1_size as usize * 8];
        host.read_exact(&cx, &mut raw, l1_offset)?;
        let l1 = l1::L1::new(&raw, l1_offset);
        let backing = match h.backing_name_at {
            0 => None,
            _ if remote => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a qcow2 image with a backing file is not supported over NBD",
                ))
            }
            // At depth 0 an automatic format was probed: the header may be a raw image's
            // data, written by whoever writes that image.
            _ if depth == 0 && opts.format == Format::Auto => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "no --format given, and the probe found qcow2 naming a backing file \
                         ({}); a writer of a raw image can put such a header in it, so the \
                         backing file is followed only with --format qcow2",
                        backing::name(&cx, &host, &h)?
                    ),
                ))
            }
            _ => Some(backing::open(&cx, &host, &h, path, opts, depth)?),
        };
        let alloc = match opts.writable {
            false => None,
            true => {
                let refcounts = refcount::Refcounts::load(&cx, &host, &h)?;
                let file_len = host.file.len();
                Some(Allocator::open(
                    &cx,
                    &host,
                    refcounts,
                    file_len,
                    h.cluster_bits,
                    h.version >= 3,
                )?)
            }
        };
        if opts.writable && h.version == 3 {
            // Set (or kept) until a clean close, so that the clusters a kill leaks are
            // reclaimed at the next open, ours or QEMU's.
            let bits = h.incompatible | header::DIRTY;
            host.write_durable(&cx, &bits.to_be_bytes(), header::INCOMPATIBLE_FIELD)?;
        }
        let cs = h.cluster_size() as usize;
        Ok(Qcow2Backend {
            path: path.to_owned(),
            size: AtomicU64::new(size),
            l1,
            l2: L2Cache::new(h.cluster_size(), l1_size),
            write_back: deferred::WriteBack::default(),
            snapshots: AtomicUsize::new(snapshots.len()),
            table: Mutex::new(snapshot_edit::TableAt {
                offset: h.snapshots_offset,
                count: h.nb_snapshots,
            }),
            shown,
            clusters: RangeLocks::default(),
            l1_locks: RangeLocks::default(),
            alloc,
            backing,
            decompressor: Decompressor::default(),
            bufs: BouncePool::new(cs, 4096, 8),
            zbufs: BouncePool::new(2 * cs, 4096, 4),
            writable: opts.writable,
            corrupt_seen: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            host,
            h,
        })
    }

    /// L2 tables read from the file so far (cache misses).
    pub fn l2_misses(&self) -> u64 {
        self.l2.misses()
    }

    fn cluster_size(&self) -> u64 {
        self.h.cluster_size()
    }

    /// The guest cluster holding byte `offset`.
    fn cluster_of(&self, offset: u64) -> u64 {
        offset >> self.h.cluster_bits
    }

    /// Holds guest clusters `[first, end)` in `mode`.
    fn hold(&self, cx: &Ctx<'_>, first: u64, end: u64, mode: Mode) -> RangeGuard<'_> {
        self.clusters.lock(cx, Span { start: first, end }, mode)
    }

    /// What guest cluster `cluster` maps to now.
    fn lookup(&self, cx: &Ctx<'_>, cluster: u64) -> io::Result<Mapping> {
        self.lookup_by(cluster, |table, l2i| {
            self.l2.get(cx, &self.host, table, l2i)
        })
        .map_err(|e| self.corrupt(e, cluster))
    }

    /// A damaged table met while serving guest cluster `cluster`: logged with the image,
    /// the guest offset and what is wrong, as QEMU logs "Marking image as corrupt" (the
    /// first time at error level, then at debug level, so a guest cannot flood the log),
    /// and answered `EIO`. The image is left as it is (`qemu-img check` tells more).
    fn corrupt(&self, e: io::Error, cluster: u64) -> io::Error {
        if e.kind() != io::ErrorKind::InvalidData {
            return e;
        }
        let line = format!(
            "qcow2 image {} is corrupt: guest offset {:#x}: {e}; requests there fail with EIO",
            self.path.display(),
            cluster << self.h.cluster_bits
        );
        match self.corrupt_seen.fetch_add(1, Ordering::Relaxed) {
            0 => log::error!("{line}"),
            _ => log::debug!("{line}"),
        }
        io::Error::from_raw_os_error(libc::EIO)
    }

    fn lookup_by(
        &self,
        cluster: u64,
        entry_of: impl FnOnce(u64, usize) -> io::Result<u64>,
    ) -> io::Result<Mapping> {
        let (l1i, l2i) = self.split(cluster);
        let Some(l1e) = self.l1.get(l1i) else {
            return Ok(Mapping::Unallocated);
        };
        let Some(table) = entry::l2_table(l1e) else {
            return Ok(Mapping::Unallocated);
        };
        Ok(Mapping::decode(entry_of(table, l2i)?, self.h.cluster_bits))
    }

    /// (L1 index, L2 index) of a guest cluster.
    fn split(&self, cluster: u64) -> (usize, usize) {
        let n = self.h.l2_entries();
        ((cluster / n) as usize, (cluster % n) as usize)
    }

    fn check_writable(&self) -> io::Result<&Allocator> {
        self.alloc
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EROFS))
    }

    /// The end of `[offset, offset + len)`, after growing the virtual disk to reach it
    /// (rounded up to a sector, as qcow2 sizes are) if it ends past the end: a growable
    /// export's writes.
    fn grow_to_reach(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<u64> {
        let end = crate::checked_end(offset, len)?;
        if end > self.len() {
            self.resize_to(cx, end.next_multiple_of(512), true)?;
        }
        Ok(end)
    }
}

impl BlockBackend for Qcow2Backend {
    fn len(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        self.read(cx, bufs, offset)
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.write(cx, bufs, offset)
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        let Some(alloc) = self.alloc.as_ref() else {
            return self.host.file.flush(cx);
        };
        let pending = alloc.take_pending();
        self.write_back(cx)?;
        self.host.file.flush(cx)?;
        alloc.apply_frees(cx, &self.host, pending)
    }

    /// The closing writes, then the image file's and the backing file's locks released.
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        let finished = self.finish(cx);
        let host = self.host.file.close(cx);
        let backing = self.backing.as_ref().map_or(Ok(()), |b| b.close(cx));
        finished.and(host).and(backing)
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.zero(cx, offset, len, true)
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.zero(cx, offset, len, may_unmap)
    }

    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.resize_to(cx, new_len, false)
    }

    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        self.status(cx, offset)
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        self.host.file.allocated_bytes()
    }

    fn read_only(&self) -> bool {
        !self.writable
    }

    fn describe(&self) -> String {
        let ro = if self.writable { "" } else { ", read-only" };
        let backing = match &self.backing {
            Some(b) => format!(", backing {}", b.describe()),
            None => String::new(),
        };
        let cs = match self.cluster_size() {
            cs if cs < 1024 => format!("{cs} B"),
            cs => format!("{} KiB", cs / 1024),
        };
        let snapshots = match (&self.shown, self.snapshots.load(Ordering::Relaxed)) {
            (Some(s), _) => format!(", snapshot {} ({})", s.id, s.name),
            (None, 0) => String::new(),
            (None, 1) => ", 1 internal snapshot".to_owned(),
            (None, n) => format!(", {n} internal snapshots"),
        };
        format!(
            "qcow2:{} (v{}, {cs} clusters{backing}{snapshots}{ro})",
            self.path.display(),
            self.h.version,
        )
    }

    fn stats(&self) -> crate::BackendStats {
        crate::BackendStats {
            range_waits: self.clusters.waits(),
            ..self.host.file.stats()
        }
    }

    fn abort(&self) {
        self.host.file.abort();
    }

    fn waits_are_bounded(&self) -> bool {
        self.host.file.waits_are_bounded()
            && self.backing.as_ref().is_none_or(|b| b.waits_are_bounded())
    }

    fn snapshot_create(&self, cx: &Ctx<'_>, name: &str) -> io::Result<SnapshotInfo> {
        self.create_snapshot(cx, name)
    }

    fn snapshot_delete(
        &self,
        cx: &Ctx<'_>,
        id: Option<&str>,
        name: Option<&str>,
    ) -> io::Result<SnapshotInfo> {
        self.delete_snapshot(cx, id, name)
    }
}

impl Qcow2Backend {
    /// The closing writes, once ([`closed`](Self::closed) says whether they ran): syncs,
    /// frees what waited for a flush and returns the unused reservation, so that a
    /// cleanly stopped export leaves no leaked clusters; then, all of that durable,
    /// clears the DIRTY bit (v3). If any of it fails, the bit stays: the next open repairs.
    fn finish(&self, cx: &Ctx<'_>) -> io::Result<()> {
        let Some(alloc) = self.alloc.as_ref() else {
            return Ok(());
        };
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let pending = alloc.take_pending();
        let done = self
            .write_back(cx)
            .and_then(|()| self.host.file.flush(cx))
            .and_then(|()| alloc.apply_frees(cx, &self.host, pending))
            .and_then(|()| alloc.release(cx, &self.host))
            .and_then(|()| self.host.file.flush(cx))
            .and_then(|()| match self.h.version {
                3 => self.host.write_durable(
                    cx,
                    &self.h.incompatible.to_be_bytes(),
                    header::INCOMPATIBLE_FIELD,
                ),
                _ => Ok(()),
            });
        done.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "qcow2 {}: closing: {e} (clusters may be leaked)",
                    self.path.display()
                ),
            )
        })
    }
}

impl Drop for Qcow2Backend {
    /// The closing writes of a backend dropped without [`close`](BlockBackend::close).
    fn drop(&mut self) {
        if let Err(e) = self.finish(&Ctx::Blocking) {
            log::warn!("{e}");
        }
    }
}
