//! [`DirFs`]: the directory export as a [`FileSystem`](transport::FileSystem), so that every transport (coroutine
//! queue, inline, threads, FUSE over io_uring) and the accounting serve it as they serve
//! the image export.
//!
//! Each request is decoded by `fuse`, answered here from the [`Tree`] (names, attributes)
//! and the [`Handles`] (open files and directories), with the data of READ and WRITE going
//! through the request's [`Ctx`](runtime::Ctx) (io_uring from a coroutine, blocking
//! syscalls elsewhere) between the transport's buffers and the source file with no copy of
//! ours.
//!
//! This file keeps the export's state ([`DirFs`], its [`Scratch`] and statistics); `ops`
//! is its [`Operations`](transport::Operations): which family answers a request, on which
//! thread, with whose credentials. Each family of requests is answered in a module of its
//! own, whose doc says which rules of the source it keeps:
//! - `entries`: names and node lifetime (LOOKUP, MKDIR, MKNOD, SYMLINK, LINK, UNLINK,
//!   RMDIR, RENAME, RENAME2, READLINK, FORGET), a new node given to its caller;
//! - `attrs`: GETATTR, SETATTR, ACCESS, STATFS, how long attributes are valid, and the
//!   privilege bits a data change clears;
//! - `open`: OPEN, CREATE and RELEASE, the cache flags and FUSE passthrough's choices;
//! - `data`: READ, WRITE, FSYNC, FALLOCATE, LSEEK, COPY_FILE_RANGE;
//! - `dirs`: OPENDIR, READDIR, READDIRPLUS, FSYNCDIR;
//! - `xattrs`: GETXATTR, LISTXATTR, SETXATTR, REMOVEXATTR;
//! - `locks`: GETLK, SETLK, SETLKW, and what FLUSH and INTERRUPT do to locks;
//! - `options`: [`DirOptions`] and its policies; `session`: the `FileSystem` trait
//!   (what is asked for at INIT, the session's start, the entry point of every request).
//!
//! Decided here, for every family:
//! - Credentials: the requests that change the tree (making nodes, links, renames,
//!   attribute and extended attribute changes) run with their caller's file system
//!   credentials where the daemon can take them on ([`crate::creds`],
//!   [`fuse::OpKind::changes_as_caller`]).
//! - POLL, TMPFILE and STATX answer ENOSYS: the kernel falls back to GETATTR.
//! - What blocks (the contract in `transport::service`): in coroutine dispatch, data goes
//!   through the ring. On a network or FUSE source ([`MetadataPolicy`]) metadata calls
//!   run off the loop too: LOOKUP's path walk through the ring (`IORING_OP_OPENAT2`, a
//!   name in the source's dentry cache opens at submission, any other in a kernel worker),
//!   every other metadata request on a helper thread ([`crate::offload`]; which kinds:
//!   `ops::runs_on_loop`) while its coroutine waits on the ring; tested with a source
//!   that stalls a LOOKUP and a MKDIR, `dir/tests/stall.rs`. On a local source they run on the loop, measured cheaper
//!   there: `fstat` of descriptors already open, the `*at` calls that make, rename or
//!   remove names (each on a directory the lookup already walked to), xattrs, getdents64
//!   (io_uring has no such operation) and READDIRPLUS's lookups. Locks and FLUSH never
//!   wait (non-blocking calls, retried with a pause on the ring).

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use fuse::abi::*;
use fuse::backing;
use fuse::{Errno, Reply};
use transport::Answer;
use zerocopy::FromZeros;

use crate::fresh::Notifier;
use crate::handles::Handles;
use crate::locks::Locks;
use crate::offload::Offload;
use crate::sys;
use crate::tree::Tree;

mod attrs;
mod data;
mod dirs;
mod entries;
mod locks;
mod open;
mod ops;
mod options;
mod session;
mod xattrs;

pub use data::COPY_CHUNK;
pub use options::{Cache, DirOptions, MetadataPolicy, PassthroughPolicy};

/// Helper threads for the metadata calls run off the loop.
const OFFLOAD_THREADS: usize = 8;

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
                let remote = runtime::remote_file_system(root.as_fd());
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
        *self.listing()
    }

    /// The listing stats, to add to (a poisoned lock is taken over: they are counters).
    fn listing(&self) -> std::sync::MutexGuard<'_, ListingStats> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The answer to a request whose reply is its status alone.
fn status<'b>(unique: u64, result: io::Result<()>) -> Answer<'b> {
    result.map(|()| Reply::empty(unique)).map_err(errno)
}
