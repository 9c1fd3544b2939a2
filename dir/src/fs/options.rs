//! How the export is served: [`DirOptions`] and its policies (what the kernel's page cache
//! keeps, which opens FUSE passthrough serves, where metadata calls run), given when the
//! export is made ([`DirFs::new`](super::DirFs::new)) and fixed for its life.

use std::time::Duration;

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
/// Measured (benches/HISTORY.md, "Metadata off the loop (issue 22)", the ring against
/// direct calls): on a local ext4 source the ring costs nothing where the name is in the
/// source's dentry cache but sends every other name, and every name a CREATE looks up
/// first, to an io_uring worker thread: `create` ran at 0.4-1.0x with up to 2.9x the daemon
/// CPU per file; a helper thread costs a hand-off per request too. A local file system
/// answers from its page cache without waiting, so off the loop buys nothing there; a
/// network or FUSE source is where a metadata call waits.
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
