//! [`DirFs`]: the directory export as a [`FileSystem`], so that every transport (coroutine
//! queue, inline, threads, FUSE over io_uring) and the accounting serve it as they serve
//! the image export.
//!
//! Each request is decoded by `fuse`, answered here from the [`Tree`] (names, attributes)
//! and the [`Handles`] (open files and directories), with the data of READ and WRITE going
//! through the request's [`Ctx`] (io_uring from a coroutine, blocking syscalls elsewhere)
//! between the transport's buffers and the source file with no copy of ours.
//!
//! What is answered how, where it is not the obvious passthrough:
//! - READDIRPLUS looks every entry up (one lookup counted, undone if the entry does not
//!   fit); `.` and `..` go without attributes (node id 0: the kernel counts no lookup for
//!   them), and so does an entry whose lookup finds no descriptor left.
//! - Every node the kernel holds keeps an `O_PATH` descriptor while it is among the
//!   [`DirOptions::node_fds`] most recently used; the others are closed and reopened
//!   from their file handles when next used ([`crate::nodefd`]), so the nodes held at once
//!   are not bounded by the open-file limit (where file handles work: as root, on a file
//!   system that has them).
//! - File locks (GETLK/SETLK/SETLKW, POSIX and flock) are taken on the source file, per
//!   lock owner, and let go at FLUSH and RELEASE ([`crate::locks`]); a blocking one waits
//!   without stopping the loop and ends on INTERRUPT (FUSE_POSIX_LOCKS, FUSE_FLOCK_LOCKS).
//! - POLL, TMPFILE and STATX answer ENOSYS: the kernel falls back to GETATTR.
//! - COPY_FILE_RANGE (and its 64-bit form) is passed through: `copy_file_range(2)` between
//!   the two source files, so the data never crosses /dev/fuse (a reflink where the source
//!   file system has them). It is a blocking call on every transport (io_uring has no
//!   such operation), so one request copies at most [`COPY_CHUNK`] bytes and answers the
//!   count: a short copy, which callers of copy_file_range(2) loop on, as they must.
//! - FUSE passthrough ([`PassthroughPolicy`], Linux 6.9+, root): an open of a regular
//!   file in the passthrough family names its node's backing file, registered from the
//!   first such open's descriptor and unregistered at the node's last RELEASE
//!   ([`fuse::backing::Inode`] keeps one mode per node while opens of it live, as the
//!   kernel requires; a node whose registration failed is served for as long as its
//!   served opens live). The kernel then sends the open's reads, writes and mappings
//!   straight to the source file, where the policy does not keep them here
//!   (`FOPEN_DIRECT_IO` beside `FOPEN_PASSTHROUGH`). Attributes still come from here:
//!   after a passthrough write the kernel asks again; a shared mapping's writes change
//!   the source's times with no request, so while an open that passes through may
//!   write, its node's attributes are answered valid for no time ([`crate::fresh`]).
//!   Without the kernel's support or CAP_SYS_ADMIN (EPERM at the first registration),
//!   one log line, and every open is served as before.
//! - What blocks (the contract in `transport::service`): in coroutine dispatch, data goes
//!   through the ring. On a network or FUSE source ([`MetadataPolicy`]) metadata calls
//!   run off the loop too: LOOKUP's path walk through the ring (`IORING_OP_OPENAT2`, a
//!   name in the source's dentry cache opens at submission, any other in a kernel worker),
//!   every other metadata request on a helper thread ([`crate::offload`]) while its
//!   coroutine waits on the ring; tested with a source that stalls a LOOKUP and a MKDIR,
//!   `dir/tests/stall.rs`. On a local source they run on the loop, measured cheaper
//!   there: `fstat` of descriptors already open, the `*at` calls that make, rename or
//!   remove names (each on a directory the lookup already walked to), xattrs, getdents64
//!   (io_uring has no such operation) and READDIRPLUS's lookups. Locks and FLUSH never
//!   wait (non-blocking calls, retried with a pause on the ring).
//! - FLUSH lets go of the closing owner's POSIX locks and answers at once (the source's
//!   own close semantics apply at RELEASE).
//! - A GETXATTR or LISTXATTR value goes in the transport's data buffer, which it hands
//!   over only for requests that fit its small-request area; a longer name gets ERANGE.

use std::ffi::CStr;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fuse::abi::*;
use fuse::backing::{self, Mode};
use fuse::init::{InitConfig, Negotiated};
use fuse::reply::{Pushed, ReaddirBuf, ReaddirPlusBuf};
use fuse::{Errno, Operation, Reply, Request};
use runtime::Ctx;
use transport::FileSystem;
use zerocopy::FromZeros;

use crate::attr;
use crate::caller;
use crate::fresh::{self, Notifier};
use crate::handles::{Backed, Handles, Open};
use crate::inodes::{Entry, Inode};
use crate::locks::Locks;
use crate::offload::Offload;
use crate::sys;
use crate::tree::{SetAttr, Time, Tree};

/// What the kernel's page cache keeps of the files' data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cache {
    /// Nothing: every read and write reaches the daemon (`FOPEN_DIRECT_IO`).
    Never,
    /// Cached while open, dropped at each open (the kernel's default): changes made on the
    /// source by others show at the next open.
    #[default]
    Auto,
    /// Kept across opens (`FOPEN_KEEP_CACHE`): for a source nobody else changes.
    Always,
}

/// Which opens FUSE passthrough serves (Linux 6.9+, a daemon with CAP_SYS_ADMIN;
/// elsewhere every open is served as with `Never`, after one log line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PassthroughPolicy {
    /// Reads, buffered writes and mappings go straight to the source file; an `O_DIRECT`
    /// open that may write keeps its reads and writes on the daemon, which runs direct
    /// writes in parallel where the kernel's passthrough takes the inode lock for each
    /// (fio, ext4, 4 KiB O_DIRECT random writes at iodepth 64: 85k IOPS through the
    /// daemon against 10.8k passed through).
    #[default]
    Auto,
    /// Every open's reads, writes and mappings go to the source file (libfuse
    /// passthrough_hp's default).
    Always,
    /// Every read and write is served by the daemon.
    Never,
}

/// How the export is served.
#[derive(Clone, Copy, Debug)]
pub struct DirOptions {
    /// Refuse every change (EROFS).
    pub read_only: bool,
    /// How long the kernel may cache names and attributes.
    pub timeout: Duration,
    pub cache: Cache,
    /// The kernel's writeback cache (`FUSE_WRITEBACK_CACHE`): writes are gathered in the
    /// page cache and sent later, in large pieces. Files are then opened read-write even
    /// for writing only (the kernel reads to fill partly written pages) and without
    /// O_APPEND (the kernel places appends itself).
    pub writeback: bool,
    /// Node descriptors kept open at most where file handles allow reopening the others
    /// ([`crate::nodefd`]); `None`: half the open-file limit.
    pub node_fds: Option<usize>,
    /// Which opens FUSE passthrough serves (never with `writeback`: the kernel has no
    /// passthrough beside the writeback cache).
    pub passthrough: PassthroughPolicy,
    /// Where metadata calls run in coroutine dispatch.
    pub metadata: MetadataPolicy,
}

/// Where the metadata calls of a request run in coroutine dispatch: off the loop, so that
/// a call the source is slow to answer holds back only its own request (LOOKUP walks the
/// path through the loop's ring, `IORING_OP_OPENAT2`; every other metadata request runs
/// on a helper thread while its coroutine waits on the ring, [`crate::offload`]), or on
/// the loop (direct system calls).
///
/// Measured (BENCHMARKS.md, "Lookups through the ring"): on a local ext4 source the ring
/// costs nothing where the name is in the source's dentry cache but sends every other
/// name, and every name a CREATE looks up first, to an io_uring worker thread: `create`
/// ran at 0.4-1.0x with up to 2.9x the daemon CPU per file; a helper thread costs a
/// hand-off per request too. A local file system answers from its page cache without
/// waiting, so off the loop buys nothing there; a network or FUSE source is where a
/// metadata call waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetadataPolicy {
    /// Off the loop where the source is a network or FUSE file system (NFS, SMB, 9p,
    /// Ceph, AFS, Lustre, GlusterFS and the like through FUSE...), on it elsewhere.
    #[default]
    Auto,
    /// Always off the loop.
    OffLoop,
    /// Always on the loop.
    OnLoop,
}

/// Helper threads for the metadata calls run off the loop.
const OFFLOAD_THREADS: usize = 8;

impl Default for DirOptions {
    fn default() -> Self {
        DirOptions {
            read_only: false,
            timeout: Duration::from_secs(1),
            cache: Cache::Auto,
            writeback: false,
            node_fds: None,
            passthrough: PassthroughPolicy::Auto,
            metadata: MetadataPolicy::Auto,
        }
    }
}

/// The most one COPY_FILE_RANGE copies (a blocking call: this bounds how long it holds
/// the loop, to about what a 1 MiB WRITE takes).
pub const COPY_CHUNK: usize = 1 << 20;

/// Storage for one reply's argument structs, on the serving coroutine's stack.
pub struct Scratch {
    entry: fuse_entry_out,
    attr: fuse_attr_out,
    open: fuse_open_out,
    statfs: fuse_statfs_out,
    xattr: fuse_getxattr_out,
    write: fuse_write_out,
    copy: fuse_copy_file_range_out,
    lseek: fuse_lseek_out,
    lk: fuse_lk_out,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            entry: FromZeros::new_zeroed(),
            attr: FromZeros::new_zeroed(),
            open: FromZeros::new_zeroed(),
            statfs: FromZeros::new_zeroed(),
            xattr: FromZeros::new_zeroed(),
            write: FromZeros::new_zeroed(),
            copy: FromZeros::new_zeroed(),
            lseek: FromZeros::new_zeroed(),
            lk: FromZeros::new_zeroed(),
        }
    }
}

/// What listings cost, summed over the directories released so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListingStats {
    /// The streams' own counts: getdents64 calls and time, seeks, entries.
    pub streams: crate::dirstream::StreamStats,
    /// READDIR and READDIRPLUS requests, and the time spent answering them (the
    /// driver's time plus encoding and, for READDIRPLUS, the lookups).
    pub requests: u64,
    pub request_ns: u64,
}

/// What the directory export adds to `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirStats {
    /// Nodes the kernel holds now, the root included.
    pub nodes: u64,
    /// Nodes the kernel forgot, kept so that file handles of the mount find them again.
    #[serde(default)]
    pub forgotten: u64,
    /// Files and directories open now.
    pub open: u64,
    /// The node descriptor budget ([`crate::nodefd`]).
    pub descriptors: crate::nodefd::DescriptorStats,
    pub listing: ListingStats,
}

/// A source directory exported over FUSE.
pub struct DirFs {
    tree: Tree,
    handles: Handles,
    options: DirOptions,
    source: String,
    listing: std::sync::Mutex<ListingStats>,
    /// The daemon runs as root: new nodes are given to their caller.
    as_root: bool,
    /// FUSE passthrough's session side.
    passthrough: backing::Session,
    /// Lock owners' descriptions on the source files.
    locks: Locks,
    /// Helper threads for metadata calls off the loop ([`MetadataPolicy`]); `None`: on it.
    offload: Option<Offload>,
    /// Tells the kernel which cached attributes went stale ([`crate::fresh`]).
    notify: Notifier,
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

type Answer<'b> = Result<Reply<'b>, Errno>;

/// A handle checked to be an open file, held for the request.
struct OpenFile(std::sync::Arc<Open>);

impl OpenFile {
    fn fd(&self) -> &std::os::fd::OwnedFd {
        match &*self.0 {
            Open::File(fd, _) => fd,
            Open::Dir(_) => unreachable!("DirFs::file checks the kind"),
        }
    }
}

impl DirFs {
    /// Exports `source`. Raises the process's open-file limit as far as it may: every
    /// node the kernel holds keeps an `O_PATH` descriptor while it is within the budget
    /// ([`DirOptions::node_fds`]; by default half the limit, the other half left for open
    /// files and directories).
    pub fn new(source: &Path, options: DirOptions) -> io::Result<DirFs> {
        let limit = match sys::raise_nofile_limit() {
            Ok(limit) => limit,
            Err(e) => {
                log::warn!("cannot raise the open-file limit: {e}");
                1024
            }
        };
        let node_fds = options
            .node_fds
            .unwrap_or_else(|| usize::try_from(limit / 2).unwrap_or(usize::MAX));
        log::debug!("open-file limit {limit}, node descriptors kept open {node_fds}");
        let tree = Tree::new(source, options.read_only, node_fds)?;
        let off_loop = match options.metadata {
            MetadataPolicy::OffLoop => true,
            MetadataPolicy::OnLoop => false,
            MetadataPolicy::Auto => {
                let root = tree.node(crate::inodes::ROOT)?.handle()?;
                let remote = sys::remote_file_system(root.as_fd());
                if let Some(kind) = remote {
                    log::info!("the source is on {kind}: metadata calls run off the loop");
                }
                remote.is_some()
            }
        };
        let offload = match off_loop {
            true => Some(Offload::new(OFFLOAD_THREADS)?),
            false => None,
        };
        Ok(DirFs {
            tree,
            offload,
            handles: Handles::default(),
            options,
            source: source.display().to_string(),
            listing: Default::default(),
            as_root: fuse::mount::is_root(),
            passthrough: backing::Session::default(),
            locks: Locks::default(),
            notify: Notifier::default(),
        })
    }

    /// The tree (for tests and statistics).
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Open handles (for tests and statistics).
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// The counters `--stats` shows.
    pub fn stats(&self) -> DirStats {
        DirStats {
            nodes: self.tree.inodes.len() as u64,
            forgotten: self.tree.inodes.forgotten() as u64,
            open: self.handles.len() as u64,
            descriptors: self.tree.inodes.descriptor_stats(),
            listing: self.listing_stats(),
        }
    }

    /// What passthrough did, where it was asked for.
    pub fn passthrough_stats(&self) -> Option<backing::PassthroughStats> {
        self.wants_passthrough().then(|| self.passthrough.stats())
    }

    /// Whether the export asks for passthrough at INIT.
    fn wants_passthrough(&self) -> bool {
        self.options.passthrough != PassthroughPolicy::Never && !self.options.writeback
    }

    /// What the listings of released directories cost.
    pub fn listing_stats(&self) -> ListingStats {
        *self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn valid(&self) -> (u64, u32) {
        let t = self.options.timeout;
        (t.as_secs(), t.subsec_nanos())
    }

    /// How long the kernel may keep `inode`'s attributes: no time while a passthrough
    /// open of it may write ([`crate::fresh`]).
    fn attr_valid(&self, inode: Option<&Inode>) -> (u64, u32) {
        match inode {
            Some(inode) if inode.writers.any() => (0, 0),
            _ => self.valid(),
        }
    }

    /// [`DirFs::attr_valid`] of node `nodeid` (looked up only where passthrough is on).
    fn attr_valid_of(&self, nodeid: u64) -> (u64, u32) {
        if !self.passthrough.is_on() {
            return self.valid();
        }
        self.attr_valid(self.tree.inodes.get(nodeid).as_deref())
    }

    fn fill_entry(&self, out: &mut fuse_entry_out, e: &Entry) {
        let (secs, nsecs) = self.valid();
        let (attr_secs, attr_nsecs) = self.attr_valid(Some(&e.inode));
        *out = fuse_entry_out {
            nodeid: e.nodeid,
            generation: e.inode.generation,
            entry_valid: secs,
            attr_valid: attr_secs,
            entry_valid_nsec: nsecs,
            attr_valid_nsec: attr_nsecs,
            attr: attr::of_stat(&e.attr),
        };
    }

    fn entry<'b>(&self, unique: u64, s: &'b mut Scratch, e: io::Result<Entry>) -> Answer<'b> {
        let e = e.map_err(errno)?;
        self.fill_entry(&mut s.entry, &e);
        Ok(Reply::entry(unique, &s.entry))
    }

    /// A GETATTR or SETATTR reply: `st` as the attributes of `req`'s node.
    fn attr<'b>(
        &self,
        req: &Request<'_>,
        s: &'b mut Scratch,
        st: io::Result<libc::stat>,
    ) -> Answer<'b> {
        let (unique, st) = (req.unique, st.map_err(errno)?);
        let (secs, nsecs) = self.attr_valid_of(req.nodeid);
        s.attr = FromZeros::new_zeroed();
        (s.attr.attr_valid, s.attr.attr_valid_nsec) = (secs, nsecs);
        s.attr.attr = attr::of_stat(&st);
        Ok(Reply::arg(unique, &s.attr))
    }

    /// COPY_FILE_RANGE between two open files: at most [`COPY_CHUNK`] bytes, after the
    /// output's privilege bits are cleared ([`DirFs::kill_unless_fsetid`]).
    fn copy_file_range(
        &self,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
    ) -> Result<usize, Errno> {
        if self.options.read_only {
            return Err(Errno::EROFS);
        }
        if arg.flags != 0 {
            return Err(Errno::EINVAL);
        }
        let (from, to) = (self.file(arg.fh_in)?, self.file(arg.fh_out)?);
        let len = usize::try_from(arg.len)
            .unwrap_or(usize::MAX)
            .min(COPY_CHUNK);
        let (off_in, off_out) = (arg.off_in, arg.off_out);
        self.kill_unless_fsetid(req, arg.nodeid_out, to.fd().as_fd())
            .map_err(errno)?;
        sys::copy_file_range(from.fd().as_fd(), off_in, to.fd().as_fd(), off_out, len)
            .map_err(errno)
    }

    /// The open file behind `fh`; EBADF if this server did not open it (or it is a
    /// directory).
    fn file(&self, fh: u64) -> Result<OpenFile, Errno> {
        match self.handles.get(fh) {
            Some(open) if matches!(*open, Open::File(..)) => Ok(OpenFile(open)),
            _ => Err(Errno::EBADF),
        }
    }

    /// Registers the file `fd` (of node `inode`, opened by `req` with `flags`) and fills
    /// its OPEN or CREATE reply.
    ///
    /// Where the session has FUSE passthrough, the node's mode decides first
    /// ([`fuse::backing::Inode`]). An open passes its data through unless it must keep
    /// its reads and writes on the daemon ([`DirFs::keeps_data`]): then it is served as
    /// without passthrough, or, where other opens of the node pass through already (the
    /// kernel allows no other kind beside them), in the passthrough family with
    /// `FOPEN_DIRECT_IO` (its mappings, and only they, go to the source file; its
    /// splice reads use the mount's page cache, which mapped writes no longer reach: a
    /// kernel property, see README). The first open that passes through registers the
    /// node's backing file from `fd`.
    ///
    /// Otherwise, the cache policy: a file the client opened with O_DIRECT (`flags`), or
    /// any with `--cache never`, is direct I/O with parallel direct writes, as
    /// passthrough_hp answers: without FOPEN_DIRECT_IO the kernel serves an O_DIRECT
    /// write under the inode's lock, one at a time, and without
    /// FOPEN_PARALLEL_DIRECT_WRITES it takes that lock for direct writes too (it still
    /// does for appends and writes that extend the file).
    ///
    /// A passthrough open that may write counts among the node's writers
    /// ([`crate::fresh`]); says whether it did.
    fn fill_open(
        &self,
        req: &Request<'_>,
        out: &mut fuse_open_out,
        inode: &Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
    ) -> bool {
        *out = FromZeros::new_zeroed();
        let direct = flags & libc::O_DIRECT != 0 || self.options.cache == Cache::Never;
        let served = if direct {
            FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES
        } else if self.options.cache == Cache::Always {
            FOPEN_KEEP_CACHE
        } else {
            0
        };
        let backed = self.passthrough.is_on() && inode.kind == libc::S_IFREG;
        let mode = backed.then(|| {
            let keep = self.keeps_data(req, fd.as_fd(), flags);
            let mode = inode
                .backing
                .open(!keep, || self.passthrough.register(fd.as_fd()));
            (mode, keep)
        });
        out.open_flags = match mode {
            Some((Mode::Passthrough(id), keep)) => {
                self.passthrough.count_open();
                out.backing_id = id.0;
                match keep {
                    true => FOPEN_PASSTHROUGH | FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES,
                    false => FOPEN_PASSTHROUGH,
                }
            }
            Some((Mode::Served, _)) | None => served,
        };
        let mode = mode.map(|(mode, _)| mode);
        let writes = matches!(mode, Some(Mode::Passthrough(_))) && fresh::may_write(flags);
        if writes {
            inode.writers.opened();
        }
        let backed = mode.map(|mode| Backed {
            inode: Arc::clone(inode),
            mode,
            writes,
        });
        out.fh = self.handles.insert(Open::File(fd, backed));
        writes
    }

    /// Whether an open keeps its reads and writes on the daemon: under `auto`, an
    /// O_DIRECT open that may write (the daemon runs its writes in parallel); under every
    /// policy, an open that may write a file with privilege bits, by a caller without
    /// CAP_FSETID (with HANDLE_KILLPRIV_V2 the kernel leaves clearing them to the daemon,
    /// which never sees a passthrough write).
    fn keeps_data(&self, req: &Request<'_>, fd: BorrowedFd<'_>, flags: i32) -> bool {
        if flags & libc::O_ACCMODE == libc::O_RDONLY {
            return false;
        }
        if self.options.passthrough == PassthroughPolicy::Auto && flags & libc::O_DIRECT != 0 {
            return true;
        }
        let privileged =
            sys::stat(fd).map_or(true, |st| st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0);
        privileged && !caller::has_capability(req.uid, req.pid, caller::CAP_FSETID)
    }

    /// The flags a file is opened with on the source: as the client asked, but under the
    /// writeback cache read-write for writing and without O_APPEND (see [`DirOptions`]).
    fn source_flags(&self, flags: i32) -> i32 {
        if !self.options.writeback {
            return flags;
        }
        let flags = flags & !libc::O_APPEND;
        if flags & libc::O_ACCMODE == libc::O_WRONLY {
            (flags & !libc::O_ACCMODE) | libc::O_RDWR
        } else {
            flags
        }
    }

    fn setattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_setattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let v = arg.valid;
        let has = |bit: u32| v & bit != 0;
        let time = |now: u32, at: u32, secs: u64, nsecs: u32| {
            if has(now) {
                Some(Time::Now)
            } else if has(at) {
                Some(Time::At(secs as i64, nsecs))
            } else {
                None
            }
        };
        let set = SetAttr {
            mode: has(FATTR_MODE).then_some(arg.mode),
            uid: has(FATTR_UID).then_some(arg.uid),
            gid: has(FATTR_GID).then_some(arg.gid),
            size: has(FATTR_SIZE).then_some(arg.size),
            atime: time(FATTR_ATIME_NOW, FATTR_ATIME, arg.atime, arg.atimensec),
            mtime: time(FATTR_MTIME_NOW, FATTR_MTIME, arg.mtime, arg.mtimensec),
        };
        let open = if has(FATTR_FH) {
            Some(self.file(arg.fh)?)
        } else {
            None
        };
        let fd = open.as_ref().map(|o| o.fd().as_fd());
        if has(FATTR_KILL_SUIDGID) {
            self.kill_suidgid(req, req.nodeid).map_err(errno)?;
        }
        let st = self.tree.setattr(req.nodeid, &set, fd);
        self.attr(req, s, st)
    }

    fn read<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_read_in,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let len = (arg.size as usize).min(data.len());
        let mut done = 0;
        // Short reads are retried until the end of the file (a READ reply shorter than
        // asked means EOF to the kernel).
        while done < len {
            let mut bufs = [IoSliceMut::new(&mut data[done..len])];
            let n = cx
                .readv_at(fd, &mut bufs, arg.offset + done as u64)
                .map_err(errno)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(Reply::data(req.unique, &data[..done]))
    }

    fn write<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_write_in,
        payload: fuse::WriteData<'_>,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        if arg.write_flags & FUSE_WRITE_KILL_SUIDGID != 0 {
            self.kill_suidgid_of(req, req.nodeid, fd.as_fd())
                .map_err(errno)?;
        }
        let buffered = self
            .writeback_fd(arg, payload.len(), fd.as_fd())
            .map_err(errno)?;
        let n = cx
            .writev_at(
                buffered.as_ref().unwrap_or(fd),
                &payload.io_slices(),
                arg.offset,
            )
            .map_err(errno)?;
        s.write = FromZeros::new_zeroed();
        s.write.size = n as u32;
        Ok(Reply::arg(req.unique, &s.write))
    }

    /// A descriptor of its own for a write the kernel sends from the page cache
    /// (FUSE_WRITE_CACHE: shared mappings written back, through any open of the file)
    /// that an O_DIRECT open cannot take: a range not in whole pages, as the last page of
    /// a file that ends inside it is written back up to the end of the file (EINVAL from
    /// the source otherwise, and msync fails: xfstests' fsx `-Z` with mapped writes). It
    /// goes through a buffered descriptor of the same file, opened for it; page-aligned
    /// writebacks and every other write keep the open's own (`None`).
    fn writeback_fd(
        &self,
        arg: &fuse_write_in,
        len: usize,
        fd: BorrowedFd<'_>,
    ) -> io::Result<Option<OwnedFd>> {
        const PAGE: u64 = 4096;
        let whole_pages = arg.offset % PAGE == 0 && len as u64 % PAGE == 0;
        if arg.write_flags & FUSE_WRITE_CACHE == 0 || whole_pages {
            return Ok(None);
        }
        if sys::status_flags(fd)? & libc::O_DIRECT == 0 {
            return Ok(None);
        }
        sys::reopen(fd, libc::O_WRONLY).map(Some)
    }

    /// Whether `op` changes the tree as its caller ([`crate::creds`]): the node-making
    /// requests, links, renames, attribute and extended attribute changes.
    fn changes_as_caller(op: &Operation<'_>) -> bool {
        matches!(
            op,
            Operation::Create { .. }
                | Operation::Mkdir { .. }
                | Operation::Mknod { .. }
                | Operation::Symlink { .. }
                | Operation::Link { .. }
                | Operation::Rename { .. }
                | Operation::Rename2 { .. }
                | Operation::Setattr { .. }
                | Operation::Setxattr { .. }
                | Operation::Removexattr { .. }
        )
    }

    /// Gives a node just made by a caller other than root to that caller, as a local
    /// file system would (the daemon made it with its own credentials).
    fn own(&self, req: &Request<'_>, parent: u64, made: io::Result<Entry>) -> io::Result<Entry> {
        let mut e = made?;
        if self.give(req, parent, e.inode.handle()?.as_fd())? {
            e.attr = sys::stat(e.inode.handle()?.as_fd())?;
        }
        Ok(e)
    }

    /// Gives the node behind `handle`, just made in `parent` for the caller, to that
    /// caller: owner the caller's uid, group the caller's gid unless the parent directory
    /// is set-group-ID (the group the source file system gave it then stands). Only a
    /// daemon running as root can, and only a caller other than root needs it, and
    /// only where the node was not made with the caller's credentials in the first place
    /// ([`Tree::acts_as_callers`]); says whether it changed anything.
    fn give(&self, req: &Request<'_>, parent: u64, handle: BorrowedFd<'_>) -> io::Result<bool> {
        if !self.as_root || (req.uid == 0 && req.gid == 0) {
            return Ok(false);
        }
        if req.uid != 0 && self.tree.acts_as_callers() {
            return Ok(false); // born the caller's
        }
        let setgid = self.tree.getattr(parent)?.st_mode & libc::S_ISGID != 0;
        let gid = if setgid { u32::MAX } else { req.gid };
        sys::chown(handle, req.uid, gid)?;
        Ok(true)
    }

    /// RENAME2. With `RENAME_WHITEOUT` (overlayfs over the mount) the source file system
    /// leaves a whiteout (a character device 0:0) under the old name, made with the
    /// daemon's credentials; like any node a caller makes, it is given to the caller, or
    /// in a sticky directory the caller could not remove it again.
    fn rename2(
        &self,
        req: &Request<'_>,
        arg: &fuse_rename2_in,
        name: &CStr,
        newname: &CStr,
    ) -> io::Result<()> {
        let parent = req.nodeid;
        self.tree
            .rename(parent, name, arg.newdir, newname, arg.flags)?;
        if arg.flags & libc::RENAME_WHITEOUT != 0 {
            if let Some(whiteout) = self.tree.whiteout(parent, name)? {
                self.give(req, parent, whiteout.as_fd())?;
            }
        }
        Ok(())
    }

    /// Clears the privilege bits of the node `nodeid` as a data change by the caller of
    /// `req` would: see [`DirFs::kill_suidgid_of`].
    fn kill_suidgid(&self, req: &Request<'_>, nodeid: u64) -> io::Result<()> {
        self.kill_suidgid_of(req, nodeid, self.tree.node(nodeid)?.handle()?.as_fd())
    }

    /// Clears the privilege bits of the file behind `fd` (node `nodeid`) as a data change
    /// by a caller without CAP_FSETID does on a local file system: set-user-ID always; set-group-ID
    /// where the group may execute, or else (a mandatory-locking mark) where the caller
    /// is not a member of the file's group. Done before the data changes (a program run
    /// between the two must not run changed bytes with the old privileges). The kernel
    /// asks for it under HANDLE_KILLPRIV_V2 for writes, truncation and `O_TRUNC` opens
    /// (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID), and leaves
    /// `fallocate` and `copy_file_range` to the daemon ([`DirFs::kill_unless_fsetid`]).
    /// Only a daemon running as root needs to: one without CAP_FSETID has the source's
    /// kernel clear them by itself. (File capabilities the source file system removes on
    /// its own.) The kernel is told its cached attributes went stale: it invalidates
    /// only size and times after a data change, and would show the old mode.
    fn kill_suidgid_of(
        &self,
        req: &Request<'_>,
        nodeid: u64,
        fd: BorrowedFd<'_>,
    ) -> io::Result<()> {
        if !self.as_root {
            return Ok(());
        }
        let st = sys::stat(fd)?;
        let old = st.st_mode & 0o7777;
        let mut mode = old & !libc::S_ISUID;
        if mode & libc::S_ISGID != 0
            && (mode & libc::S_IXGRP != 0 || !caller::in_group(req.gid, req.pid, st.st_gid))
        {
            mode &= !libc::S_ISGID;
        }
        if mode != old {
            sys::chmod(fd, mode)?;
            self.notify.stale(nodeid);
        }
        Ok(())
    }

    /// The privilege bits of the file behind `fd` cleared before a `fallocate` or a
    /// `copy_file_range` into it, unless the caller holds CAP_FSETID
    /// ([`caller::has_capability`]).
    fn kill_unless_fsetid(
        &self,
        req: &Request<'_>,
        nodeid: u64,
        fd: BorrowedFd<'_>,
    ) -> io::Result<()> {
        if caller::has_capability(req.uid, req.pid, caller::CAP_FSETID) {
            return Ok(());
        }
        self.kill_suidgid_of(req, nodeid, fd)
    }

    /// Runs a READDIR or READDIRPLUS, counting it and its time in the listing stats.
    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let answer = f();
        let mut l = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        l.requests += 1;
        l.request_ns += started.elapsed().as_nanos() as u64;
        answer
    }

    /// READDIR and READDIRPLUS from the open directory `fh`, from `arg.offset` on.
    fn readdir<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_read_in,
        plus: bool,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let open = self.handles.get(arg.fh).ok_or(Errno::EBADF)?;
        let Open::Dir(stream) = &*open else {
            return Err(Errno::EBADF);
        };
        let mut stream = stream.lock().unwrap_or_else(|e| e.into_inner());
        if !plus {
            let mut list = ReaddirBuf::new(data, arg.size);
            stream
                .read(arg.offset, |e| {
                    !matches!(
                        list.push(e.ino, e.next, u32::from(e.kind), e.name),
                        Pushed::Full
                    )
                })
                .map_err(errno)?;
            return Ok(list.reply(req.unique));
        }
        let dir = self.tree.node(req.nodeid).map_err(errno)?;
        let mut list = ReaddirPlusBuf::new(data, arg.size);
        let mut out = fuse_entry_out::new_zeroed();
        let mut failed = None;
        stream
            .read(arg.offset, |e| {
                let counted = if e.is_dot() {
                    out = without_attributes(e);
                    None
                } else {
                    match self.tree.inodes.lookup(req.nodeid, &dir, e.cname) {
                        Ok(found) => {
                            self.fill_entry(&mut out, &found);
                            Some(found.nodeid)
                        }
                        // Gone since it was listed: leave it out.
                        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return true,
                        // Out of descriptors (a node each): list it without attributes,
                        // as for `.`; a later LOOKUP of it reports the error.
                        Err(err)
                            if matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) =>
                        {
                            out = without_attributes(e);
                            None
                        }
                        Err(err) => {
                            failed = Some(err);
                            return false;
                        }
                    }
                };
                match list.push(&out, e.next, e.name) {
                    Pushed::Full => {
                        // The kernel will not see this entry: its lookup did not happen.
                        if let Some(nodeid) = counted {
                            self.tree.inodes.forget(nodeid, 1);
                        }
                        false
                    }
                    Pushed::Added | Pushed::BadName => true,
                }
            })
            .map_err(errno)?;
        match failed {
            Some(err) if list.is_empty() => Err(errno(err)),
            _ => Ok(list.reply(req.unique)),
        }
    }

    fn statfs<'b>(&self, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        let st = self.tree.statfs(req.nodeid).map_err(errno)?;
        s.statfs = FromZeros::new_zeroed();
        let k = &mut s.statfs.st;
        (k.blocks, k.bfree, k.bavail) = (st.f_blocks, st.f_bfree, st.f_bavail);
        (k.files, k.ffree) = (st.f_files, st.f_ffree);
        (k.bsize, k.frsize, k.namelen) =
            (st.f_bsize as u32, st.f_frsize as u32, st.f_namemax as u32);
        Ok(Reply::arg(req.unique, &s.statfs))
    }

    /// GETXATTR and LISTXATTR: the size when asked with size 0, else the value.
    fn xattr<'b>(
        &self,
        unique: u64,
        size: u32,
        s: &'b mut Scratch,
        data: &'b mut [u8],
        get: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> Answer<'b> {
        if size == 0 {
            let n = get(&mut []).map_err(errno)?;
            return Ok(Reply::xattr_size(unique, n, &mut s.xattr));
        }
        let len = size as usize;
        if len > data.len() {
            return Err(Errno::ERANGE);
        }
        let n = get(&mut data[..len]).map_err(errno)?;
        Ok(Reply::xattr_value(unique, size, &data[..n]))
    }

    /// LISTXATTR. `trusted.*` names are for callers with CAP_SYS_ADMIN only, as the
    /// source's own file system lists them ([`caller::has_capability`]); for the others
    /// the list is read whole into `data` and those names are dropped, the size asked
    /// with size 0 included. A list too long for `data` answers an unfiltered size (an
    /// upper bound: the caller then asks again with room enough, and gets the filtered
    /// list).
    fn listxattr<'b>(
        &self,
        req: &Request<'_>,
        size: u32,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let (unique, node) = (req.unique, req.nodeid);
        let list = |buf: &mut [u8]| self.tree.listxattr(node, buf);
        if caller::has_capability(req.uid, req.pid, caller::CAP_SYS_ADMIN) {
            return self.xattr(unique, size, s, data, list);
        }
        let n = match list(data) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) && size == 0 => {
                return self.xattr(unique, size, s, data, list);
            }
            Err(e) => return Err(errno(e)),
        };
        let kept = drop_names(&mut data[..n], |name| name.starts_with(b"trusted."));
        if size == 0 {
            return Ok(Reply::xattr_size(unique, kept, &mut s.xattr));
        }
        Ok(Reply::xattr_value(unique, size, &data[..kept]))
    }

    /// FORGET and BATCH_FORGET drop the kernel's lookups, INTERRUPT ends a lock's wait:
    /// none of them has a reply. Every other request is answered ([`DirFs::dispatch`]).
    fn answer<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Option<Answer<'b>> {
        match req.op {
            Operation::Forget { arg } => self.tree.inodes.forget(req.nodeid, arg.nlookup),
            Operation::BatchForget { nodes, .. } => {
                for n in nodes {
                    self.tree.inodes.forget(n.nodeid, n.nlookup);
                }
            }
            Operation::Interrupt { arg } => self.locks.interrupt(arg.unique),
            _ => return Some(self.dispatch(cx, req, s, data)),
        }
        None
    }

    /// The answer to each request the kernel waits on, one call each, by family: nodes
    /// and their attributes, names, open files and their data, directories, extended
    /// attributes, the session. The short answers follow in this order; the longer ones
    /// (SETATTR, READ, WRITE, RENAME2, READDIR, STATFS, the xattrs) come before.
    fn dispatch<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        match &self.offload {
            Some(offload) if Self::off_the_loop(&req.op) => {
                offload.run(cx, || self.answer_here(&Ctx::Blocking, req, s, data))
            }
            _ => self.answer_here(cx, req, s, data),
        }
    }

    /// Whether `op`, with metadata calls off the loop ([`MetadataPolicy`]), runs on a
    /// helper thread: every request but those whose calls go through the ring (data,
    /// sync, LOOKUP's path walk) or never wait (locks, FLUSH, the session's).
    fn off_the_loop(op: &Operation<'_>) -> bool {
        !matches!(
            op,
            Operation::Lookup { .. }
                | Operation::Read { .. }
                | Operation::Write { .. }
                | Operation::Fsync { .. }
                | Operation::Fsyncdir { .. }
                | Operation::Fallocate { .. }
                | Operation::Getlk { .. }
                | Operation::Setlk { .. }
                | Operation::Setlkw { .. }
                | Operation::Flush { .. }
                | Operation::Destroy
                | Operation::Init { .. }
        )
    }

    /// [`DirFs::dispatch`] on this thread, with `cx`.
    fn answer_here<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        s: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Answer<'b> {
        let (unique, node, tree) = (req.unique, req.nodeid, &self.tree);
        let _acting =
            Self::changes_as_caller(&req.op).then(|| tree.acting_for(req.uid, req.gid, req.pid));
        match req.op {
            Operation::Lookup { name } => {
                let walk = if self.offload.is_some() {
                    cx
                } else {
                    &Ctx::Blocking
                };
                self.entry(unique, s, tree.lookup(walk, node, name))
            }
            Operation::Getattr { arg } => self.getattr(req, arg, s),
            Operation::Setattr { arg } => self.setattr(req, arg, s),
            Operation::Access { arg } => status(unique, tree.access(node, arg.mask as i32)),
            Operation::Statfs => self.statfs(req, s),

            Operation::Mkdir { arg, name } => {
                self.made(req, s, tree.mkdir(node, name, arg.mode, arg.umask))
            }
            Operation::Mknod { arg, name } => {
                let rdev = u64::from(arg.rdev);
                self.made(req, s, tree.mknod(node, name, arg.mode, rdev, arg.umask))
            }
            Operation::Symlink { name, target } => {
                self.made(req, s, tree.symlink(node, name, target))
            }
            Operation::Link { arg, newname } => {
                self.entry(unique, s, tree.link(arg.oldnodeid, node, newname))
            }
            Operation::Unlink { name } => status(unique, tree.unlink(node, name)),
            Operation::Rmdir { name } => status(unique, tree.rmdir(node, name)),
            Operation::Rename { arg, name, newname } => {
                status(unique, tree.rename(node, name, arg.newdir, newname, 0))
            }
            Operation::Rename2 { arg, name, newname } => {
                status(unique, self.rename2(req, arg, name, newname))
            }
            Operation::Readlink => self.readlink(req, data),

            Operation::Open { arg } => self.open(req, arg, s),
            Operation::Create { arg, name } => self.create(req, arg, name, s),
            Operation::Read { arg } => self.read(cx, req, arg, data),
            Operation::Write { arg, data: payload } => self.write(cx, req, arg, payload, s),
            Operation::Flush { arg } => {
                self.locks.flush(node, arg.lock_owner);
                Ok(Reply::empty(unique))
            }
            Operation::Getlk { arg } => self.getlk(req, arg, s),
            Operation::Setlk { arg } => self.setlk(cx, req, arg, false),
            Operation::Setlkw { arg } => self.setlk(cx, req, arg, true),
            Operation::Fsync { arg } => self.fsync(cx, unique, arg),
            Operation::Fallocate { arg } => self.fallocate(cx, req, arg),
            Operation::Lseek { arg } => self.lseek(unique, arg, s),
            Operation::CopyFileRange { arg } => self.copy(req, arg, false, s),
            Operation::CopyFileRange64 { arg } => self.copy(req, arg, true, s),
            Operation::Release { arg } | Operation::Releasedir { arg } => self.release(req, arg),

            Operation::Opendir { .. } => self.opendir(req, s),
            Operation::Readdir { arg } => self.timed(|| self.readdir(req, arg, false, data)),
            Operation::Readdirplus { arg } => self.timed(|| self.readdir(req, arg, true, data)),
            Operation::Fsyncdir { arg } => self.fsyncdir(cx, unique, arg),

            Operation::Getxattr { arg, name } => self.xattr(unique, arg.size, s, data, |buf| {
                tree.getxattr(node, name, buf)
            }),
            Operation::Listxattr { arg } => self.listxattr(req, arg.size, s, data),
            Operation::Setxattr { arg, name, value } => self.setxattr(req, &arg, name, value),
            Operation::Removexattr { name } => status(unique, tree.removexattr(node, name)),

            Operation::Destroy => Ok(Reply::empty(unique)),
            Operation::Init { .. } => Err(Errno::EPROTO),
            // POLL, TMPFILE, STATX and the rest (see the module's doc).
            _ => Err(Errno::ENOSYS),
        }
    }

    /// GETATTR: from the open file where the kernel names one this server opened, else
    /// from the node.
    fn getattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_getattr_in,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let by_fh = (arg.getattr_flags & FUSE_GETATTR_FH != 0)
            .then(|| self.file(arg.fh).ok())
            .flatten();
        let st = match by_fh {
            Some(open) => sys::fstat(open.fd().as_fd()),
            None => self.tree.getattr(req.nodeid),
        };
        self.attr(req, s, st)
    }

    /// MKDIR, MKNOD and SYMLINK: the new entry, given to its caller ([`DirFs::own`]).
    fn made<'b>(
        &self,
        req: &Request<'_>,
        s: &'b mut Scratch,
        made: io::Result<Entry>,
    ) -> Answer<'b> {
        self.entry(req.unique, s, self.own(req, req.nodeid, made))
    }

    /// READLINK: the target, in the data buffer.
    fn readlink<'b>(&self, req: &Request<'_>, data: &'b mut [u8]) -> Answer<'b> {
        let n = self.tree.readlink(req.nodeid, data).map_err(errno)?;
        Ok(Reply::readlink(req.unique, &data[..n]))
    }

    /// OPEN: the privilege bits cleared first where the kernel asks, then the file opened
    /// read-write for the writeback cache where the file allows it, else as asked (a
    /// write-only file stays write-only).
    fn open<'b>(&self, req: &Request<'_>, arg: &fuse_open_in, s: &'b mut Scratch) -> Answer<'b> {
        let (node, asked) = (req.nodeid, arg.flags as i32);
        if arg.open_flags & FUSE_OPEN_KILL_SUIDGID != 0 {
            self.kill_suidgid(req, node).map_err(errno)?;
        }
        let fd = self
            .tree
            .open(node, self.source_flags(asked))
            .or_else(|_| self.tree.open(node, asked))
            .map_err(errno)?;
        let inode = self.tree.node(node).map_err(errno)?;
        if self.fill_open(req, &mut s.open, &inode, fd, asked) {
            // Attributes cached before this open would hide what its mappings change.
            self.notify.stale(node);
        }
        Ok(Reply::arg(req.unique, &s.open))
    }

    /// CREATE: the new entry, given to its caller, and the open file.
    fn create<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_create_in,
        name: &CStr,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let (node, asked) = (req.nodeid, arg.flags as i32);
        let (fd, made) = self
            .tree
            .create(node, name, self.source_flags(asked), arg.mode, arg.umask)
            .map_err(errno)?;
        let e = self.own(req, node, Ok(made)).map_err(errno)?;
        // The open first: a passthrough writer's entry is valid for no time.
        self.fill_open(req, &mut s.open, &e.inode, fd, asked);
        self.fill_entry(&mut s.entry, &e);
        Ok(Reply::create(req.unique, &s.entry, &s.open))
    }

    /// FSYNC, or fdatasync where the kernel says so.
    fn fsync<'b>(&self, cx: &Ctx<'_>, unique: u64, arg: &fuse_fsync_in) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let synced = if arg.fsync_flags & FUSE_FSYNC_FDATASYNC != 0 {
            cx.fdatasync(fd)
        } else {
            cx.fsync(fd)
        };
        status(unique, synced)
    }

    /// FALLOCATE, after the privilege bits are cleared ([`DirFs::kill_unless_fsetid`]).
    fn fallocate<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_fallocate_in,
    ) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        let fd = open.fd();
        let done = self
            .kill_unless_fsetid(req, req.nodeid, fd.as_fd())
            .and_then(|()| cx.fallocate(fd, arg.mode as i32, arg.offset, arg.length));
        status(req.unique, done)
    }

    /// LSEEK (SEEK_DATA and SEEK_HOLE among others) on the source file.
    fn lseek<'b>(&self, unique: u64, arg: &fuse_lseek_in, s: &'b mut Scratch) -> Answer<'b> {
        let open = self.file(arg.fh)?;
        s.lseek.offset =
            sys::lseek(open.fd().as_fd(), arg.offset, arg.whence as i32).map_err(errno)?;
        Ok(Reply::arg(unique, &s.lseek))
    }

    /// COPY_FILE_RANGE ([`DirFs::copy_file_range`]), answered with its 32-bit count or,
    /// for COPY_FILE_RANGE_64 (`wide`), its 64-bit one.
    fn copy<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_copy_file_range_in,
        wide: bool,
        s: &'b mut Scratch,
    ) -> Answer<'b> {
        let n = self.copy_file_range(req, arg)?;
        if wide {
            s.copy.bytes_copied = n as u64;
            return Ok(Reply::arg(req.unique, &s.copy));
        }
        s.write = FromZeros::new_zeroed();
        s.write.size = n as u32; // at most COPY_CHUNK
        Ok(Reply::arg(req.unique, &s.write))
    }

    /// GETLK: the lock that would conflict on the source ([`crate::locks`]).
    fn getlk<'b>(&self, req: &Request<'_>, arg: &fuse_lk_in, s: &'b mut Scratch) -> Answer<'b> {
        let inode = self.tree.node(req.nodeid).map_err(errno)?;
        let lk = self.locks.getlk(req.nodeid, &inode, arg).map_err(errno)?;
        s.lk = fuse_lk_out { lk };
        Ok(Reply::arg(req.unique, &s.lk))
    }

    /// SETLK, or SETLKW with `wait`: the lock taken, changed or dropped on the source.
    fn setlk<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        arg: &fuse_lk_in,
        wait: bool,
    ) -> Answer<'b> {
        let (unique, node) = (req.unique, req.nodeid);
        let inode = self.tree.node(node).map_err(errno)?;
        status(
            unique,
            self.locks.setlk(cx, unique, node, &inode, arg, wait),
        )
    }

    /// RELEASE and RELEASEDIR: the handle goes, with the flock lock the kernel names and
    /// the OFD locks taken through it; a directory's listing costs join the stats, and the
    /// last passthrough open of a node unregisters its backing file (the kernel dropped
    /// the file's I/O mode before sending RELEASE).
    fn release<'b>(&self, req: &Request<'_>, arg: &fuse_release_in) -> Answer<'b> {
        let (unique, fh) = (req.unique, arg.fh);
        let flock = arg.release_flags & FUSE_RELEASE_FLOCK_UNLOCK != 0;
        self.locks
            .release(req.nodeid, fh, flock.then_some(arg.lock_owner));
        match self.handles.remove(fh).as_deref() {
            Some(Open::Dir(stream)) => {
                let stream = stream.lock().unwrap_or_else(|e| e.into_inner());
                let mut l = self.listing.lock().unwrap_or_else(|e| e.into_inner());
                l.streams.add(&stream.stats());
            }
            Some(Open::File(_, Some(b))) => {
                if b.writes {
                    b.inode.writers.released();
                }
                if let Some(id) = b.inode.backing.release(b.mode) {
                    self.passthrough.unregister(id);
                }
            }
            _ => {}
        }
        Ok(Reply::empty(unique))
    }

    /// OPENDIR: the directory's stream, registered as a handle.
    fn opendir<'b>(&self, req: &Request<'_>, s: &'b mut Scratch) -> Answer<'b> {
        let stream = self.tree.opendir(req.nodeid).map_err(errno)?;
        s.open = FromZeros::new_zeroed();
        s.open.fh = self
            .handles
            .insert(Open::Dir(std::sync::Mutex::new(stream)));
        Ok(Reply::arg(req.unique, &s.open))
    }

    /// FSYNCDIR of an open directory.
    fn fsyncdir<'b>(&self, cx: &Ctx<'_>, unique: u64, arg: &fuse_fsync_in) -> Answer<'b> {
        let open = self.handles.get(arg.fh);
        let Some(Open::Dir(stream)) = open.as_deref() else {
            return Err(Errno::EBADF);
        };
        let stream = stream.lock().unwrap_or_else(|e| e.into_inner());
        status(unique, cx.fsync(&stream.fd()))
    }

    /// SETXATTR of a value that came whole in the request's buffer: every transport reads
    /// a request into one buffer, and a value split between head and tail would need a
    /// copy this server does not make (E2BIG).
    fn setxattr<'b>(
        &self,
        req: &Request<'_>,
        arg: &fuse_setxattr_in,
        name: &CStr,
        value: fuse::WriteData<'_>,
    ) -> Answer<'b> {
        let (head, tail) = value.parts();
        if !tail.is_empty() {
            return Err(Errno::E2BIG);
        }
        let set = self.tree.setxattr(req.nodeid, name, head, arg.flags as i32);
        status(req.unique, set)
    }
}

/// The answer to a request whose reply is its status alone.
fn status<'b>(unique: u64, result: io::Result<()>) -> Answer<'b> {
    result.map(|()| Reply::empty(unique)).map_err(errno)
}

/// Removes from a list of NUL-terminated names (as listxattr(2) gives it) those `hidden`
/// picks, in place, keeping the order; returns the new length.
fn drop_names(list: &mut [u8], hidden: impl Fn(&[u8]) -> bool) -> usize {
    let (mut read, mut kept) = (0, 0);
    while read < list.len() {
        let end = list[read..]
            .iter()
            .position(|&b| b == 0)
            .map_or(list.len(), |i| read + i + 1);
        if !hidden(&list[read..end]) {
            list.copy_within(read..end, kept);
            kept += end - read;
        }
        read = end;
    }
    kept
}

/// A READDIRPLUS entry that gives the kernel no node (id 0), only the inode number and
/// type: it counts no lookup and looks the name up itself when it needs it.
fn without_attributes(e: &crate::dirstream::DirEntry<'_>) -> fuse_entry_out {
    let mut out = fuse_entry_out::new_zeroed();
    (out.attr.ino, out.attr.mode) = (e.ino, u32::from(e.kind) << 12);
    out
}

impl FileSystem for DirFs {
    type Scratch = Scratch;

    /// The protocol's defaults plus READDIRPLUS (adaptive: the kernel asks for it when a
    /// listing is followed by stats, as `ls -l` does), HANDLE_KILLPRIV_V2 (the kernel
    /// then sends no GETXATTR of `security.capability` before each WRITE; the daemon
    /// clears set-user-ID and set-group-ID where the kernel says so, see
    /// [`DirFs::kill_suidgid`]), DONT_MASK (the caller's umask comes unapplied, and the
    /// tree applies it unless a default ACL decides: [`Tree::creation_mode`]), POSIX_ACL
    /// (the kernel's permission checks, `default_permissions`, then read the source's
    /// access ACLs with GETXATTR of `system.posix_acl_access` and enforce them; without
    /// it they would check the mode bits alone, and an ACL entry denying a user would not
    /// hold through the mount, since the daemon itself acts as root), the
    /// writeback cache if asked, POSIX_LOCKS and FLOCK_LOCKS (the kernel sends every lock
    /// here and they are taken on the source: [`crate::locks`]), shared mappings of the direct-I/O files
    /// (DIRECT_IO_ALLOW_MMAP, 7.39+: O_DIRECT opens, and every file with `--cache never`),
    /// and EXPORT_SUPPORT where forgotten nodes are kept for file handles
    /// ([`crate::inodes`]: the daemon is root and the source has file handles), so that
    /// `name_to_handle_at` and `open_by_handle_at` on the mount work as on the source,
    /// across dropped caches; elsewhere NO_EXPORT_SUPPORT: the daemon could not find a
    /// node again once the kernel forgot it, so handles are refused (EOPNOTSUPP), as
    /// libfuse does by default, instead of going stale (ESTALE).
    fn init_config(&self, mut config: InitConfig) -> InitConfig {
        config.flags |= FUSE_DO_READDIRPLUS
            | FUSE_READDIRPLUS_AUTO
            | FUSE_HANDLE_KILLPRIV_V2
            | FUSE_DONT_MASK
            | FUSE_POSIX_ACL
            | FUSE_POSIX_LOCKS
            | FUSE_FLOCK_LOCKS;
        config.flags |= match self.tree.inodes.exportable() {
            true => FUSE_EXPORT_SUPPORT,
            false => FUSE_NO_EXPORT_SUPPORT,
        };
        if self.options.writeback {
            config.flags |= FUSE_WRITEBACK_CACHE;
        }
        if self.wants_passthrough() {
            config.flags |= FUSE_PASSTHROUGH;
        }
        // Files opened O_DIRECT (and all with --cache never) are FOPEN_DIRECT_IO: without
        // this the kernel refuses MAP_SHARED of them (ENODEV); with it, it writes mapped
        // pages back around each direct read and write.
        config.flags |= FUSE_DIRECT_IO_ALLOW_MMAP;
        config
    }

    fn session_started(&self, negotiated: &Negotiated, session: BorrowedFd<'_>) {
        self.notify.start(session);
        if self.wants_passthrough() {
            self.passthrough
                .start(negotiated.has(FUSE_PASSTHROUGH), session);
        } else if self.options.writeback && self.options.passthrough != PassthroughPolicy::Never {
            log::info!("FUSE passthrough: off with --writeback (the kernel has no passthrough beside the writeback cache)");
        }
    }

    fn needs_data_buffer(&self, opcode: u32) -> bool {
        matches!(
            opcode,
            FUSE_READ
                | FUSE_READDIR
                | FUSE_READDIRPLUS
                | FUSE_READLINK
                | FUSE_GETXATTR
                | FUSE_LISTXATTR
        )
    }

    fn handle<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        scratch: &'b mut Scratch,
        data: &'b mut [u8],
    ) -> Option<Reply<'b>> {
        let unique = req.unique;
        self.answer(cx, req, scratch, data)
            .map(|r| r.unwrap_or_else(|errno| Reply::error(unique, errno)))
    }

    /// Nothing is buffered here: every WRITE went to the source file before its reply.
    fn flush(&self, _cx: &Ctx<'_>) -> io::Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        let mode = if self.options.read_only {
            "read-only"
        } else {
            "writable"
        };
        format!("directory {} ({mode})", self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::drop_names;

    #[test]
    fn drop_names_keeps_the_others_in_order() {
        let trusted = |name: &[u8]| name.starts_with(b"trusted.");
        let mut list = *b"user.a\0trusted.b\0security.c\0trusted.d\0user.e\0";
        let n = drop_names(&mut list, trusted);
        assert_eq!(&list[..n], b"user.a\0security.c\0user.e\0");
        let mut only = *b"trusted.x\0";
        assert_eq!(drop_names(&mut only, trusted), 0);
        assert_eq!(drop_names(&mut [], trusted), 0);
        let mut unterminated = *b"user.a\0trusted.b";
        let n = drop_names(&mut unterminated, trusted);
        assert_eq!(&unterminated[..n], b"user.a\0");
    }
}
