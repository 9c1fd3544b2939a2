//! Request and reply structs exchanged over /dev/fuse.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Declares kernel structs with `#[repr(C)]` and the zerocopy derives.
///
/// Fields keep their kernel names and are documented by the kernel header, so
/// only fields whose meaning is not obvious carry a doc comment here.
macro_rules! abi_structs {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident { $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)? }
    )*) => {$(
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name { $( $(#[$fmeta])* #[allow(missing_docs)] pub $field: $ty ),* }
    )*};
}
pub(crate) use abi_structs;

abi_structs! {
    /// Header of every request.
    pub struct fuse_in_header {
        /// Total length of the request, this header included.
        pub len: u32,
        pub opcode: u32,
        /// Request id to echo in the reply; bit 0 marks INTERRUPT requests.
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        /// Length of trailing extensions in 8-byte units (7.38; was padding).
        pub total_extlen: u16,
        pub padding: u16,
    }

    /// Header of every reply.
    pub struct fuse_out_header {
        /// Total length of the reply, this header included.
        pub len: u32,
        /// 0 or a negated errno in -1..=-511 (signed, as in C).
        pub error: i32,
        pub unique: u64,
    }

    /// INIT request (64 bytes since 7.36; 16 bytes before, without `flags2`).
    pub struct fuse_init_in {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        /// INIT flag bits 0..31.
        pub flags: u32,
        /// INIT flag bits 32..63, valid only with FUSE_INIT_EXT in `flags`.
        pub flags2: u32,
        pub unused: [u32; 11],
    }

    /// INIT reply (64 bytes since 7.23).
    pub struct fuse_init_out {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        pub time_gran: u32,
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        pub request_timeout: u16,
        pub unused: [u16; 11],
    }

    /// File attributes, as in `struct stat`.
    pub struct fuse_attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }

    /// GETATTR request.
    pub struct fuse_getattr_in {
        pub getattr_flags: u32,
        pub dummy: u32,
        pub fh: u64,
    }

    /// GETATTR and SETATTR reply.
    pub struct fuse_attr_out {
        /// Seconds the kernel may cache these attributes.
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: fuse_attr,
    }

    /// LOOKUP reply.
    pub struct fuse_entry_out {
        pub nodeid: u64,
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: fuse_attr,
    }

    /// SETATTR request; `valid` holds FATTR_* bits.
    pub struct fuse_setattr_in {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }

    /// OPEN request.
    pub struct fuse_open_in {
        /// open(2) flags, O_CREAT/O_EXCL/O_NOCTTY removed.
        pub flags: u32,
        pub open_flags: u32,
    }

    /// OPEN reply; `open_flags` holds FOPEN_* bits.
    pub struct fuse_open_out {
        pub fh: u64,
        pub open_flags: u32,
        /// Signed, as in C (passthrough backing file id).
        pub backing_id: i32,
    }

    /// FUSE_NOTIFY_INVAL_INODE's argument: the node `ino` (a node id), and the byte range
    /// of its page cache to drop (`off` < 0: only the attributes).
    pub struct fuse_notify_inval_inode_out {
        pub ino: u64,
        pub off: i64,
        pub len: i64,
    }

    /// The argument of FUSE_DEV_IOC_BACKING_OPEN: an open file to pass I/O through to.
    pub struct fuse_backing_map {
        pub fd: i32,
        /// No flags are defined (must be 0).
        pub flags: u32,
        pub padding: u64,
    }

    /// RELEASE request.
    pub struct fuse_release_in {
        pub fh: u64,
        pub flags: u32,
        pub release_flags: u32,
        pub lock_owner: u64,
    }

    /// FLUSH request.
    pub struct fuse_flush_in {
        pub fh: u64,
        pub unused: u32,
        pub padding: u32,
        pub lock_owner: u64,
    }

    /// FSYNC request.
    pub struct fuse_fsync_in {
        pub fh: u64,
        pub fsync_flags: u32,
        pub padding: u32,
    }

    /// READ request.
    pub struct fuse_read_in {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    /// WRITE request; `size` bytes of data follow it.
    pub struct fuse_write_in {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    /// WRITE reply.
    pub struct fuse_write_out {
        pub size: u32,
        pub padding: u32,
    }

    /// FALLOCATE request.
    pub struct fuse_fallocate_in {
        pub fh: u64,
        pub offset: u64,
        pub length: u64,
        pub mode: u32,
        pub padding: u32,
    }

    /// LSEEK request.
    pub struct fuse_lseek_in {
        pub fh: u64,
        pub offset: u64,
        pub whence: u32,
        pub padding: u32,
    }

    /// LSEEK reply.
    pub struct fuse_lseek_out {
        pub offset: u64,
    }

    /// File system statistics, as in `struct statfs`.
    pub struct fuse_kstatfs {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }

    /// STATFS reply.
    pub struct fuse_statfs_out {
        pub st: fuse_kstatfs,
    }

    /// INTERRUPT request: `unique` of the request to interrupt.
    pub struct fuse_interrupt_in {
        pub unique: u64,
    }

    /// FORGET request.
    pub struct fuse_forget_in {
        pub nlookup: u64,
    }

    /// One entry of BATCH_FORGET.
    pub struct fuse_forget_one {
        pub nodeid: u64,
        pub nlookup: u64,
    }

    /// BATCH_FORGET request; `count` `fuse_forget_one` follow it.
    pub struct fuse_batch_forget_in {
        pub count: u32,
        pub dummy: u32,
    }

    /// STATX request.
    pub struct fuse_statx_in {
        pub getattr_flags: u32,
        pub reserved: u32,
        pub fh: u64,
        pub sx_flags: u32,
        pub sx_mask: u32,
    }

    /// A timestamp of `fuse_statx` (bit-compatible with statx(2)).
    pub struct fuse_sx_time {
        /// Signed, as in C.
        pub tv_sec: i64,
        pub tv_nsec: u32,
        /// `__reserved` in C.
        pub reserved: i32,
    }

    /// Extended attributes (bit-compatible with `struct statx`).
    pub struct fuse_statx {
        pub mask: u32,
        pub blksize: u32,
        pub attributes: u64,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub mode: u16,
        /// `__spare0` in C.
        pub spare0: [u16; 1],
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub attributes_mask: u64,
        pub atime: fuse_sx_time,
        pub btime: fuse_sx_time,
        pub ctime: fuse_sx_time,
        pub mtime: fuse_sx_time,
        pub rdev_major: u32,
        pub rdev_minor: u32,
        pub dev_major: u32,
        pub dev_minor: u32,
        /// `__spare2` in C.
        pub spare2: [u64; 14],
    }

    /// STATX reply.
    pub struct fuse_statx_out {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub flags: u32,
        pub spare: [u64; 2],
        pub stat: fuse_statx,
    }
}
