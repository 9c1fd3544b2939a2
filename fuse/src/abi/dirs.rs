//! Structs of the requests beyond a node's data and attributes: creating,
//! linking and renaming names, directory listings, extended attributes, POSIX
//! locks, copy_file_range and poll.
//!
//! Most of these requests carry one or two NUL-terminated names after the
//! struct (see [`crate::decode`] for the layouts); the structs themselves are
//! fixed-size. `fuse_dirent` ends in a flexible `char name[]` in C: here the
//! struct stops before the name ([`FUSE_NAME_OFFSET`] bytes), and
//! [`crate::reply::ReaddirBuf`] writes the name and padding after it.

use super::structs::{abi_structs, fuse_entry_out};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

abi_structs! {
    /// A POSIX lock range, as in `struct flock`.
    pub struct fuse_file_lock {
        pub start: u64,
        /// Last byte of the range, inclusive (`OFFSET_MAX` for "to the end").
        pub end: u64,
        /// F_RDLCK, F_WRLCK or F_UNLCK.
        pub r#type: u32,
        /// Thread group id of the lock holder.
        pub pid: u32,
    }

    /// MKNOD request; the new entry's name follows it.
    pub struct fuse_mknod_in {
        pub mode: u32,
        pub rdev: u32,
        /// The caller's umask (7.12+), already applied unless FUSE_DONT_MASK.
        pub umask: u32,
        pub padding: u32,
    }

    /// MKDIR request; the new directory's name follows it.
    pub struct fuse_mkdir_in {
        pub mode: u32,
        pub umask: u32,
    }

    /// RENAME request; the old name and the new name follow it.
    pub struct fuse_rename_in {
        /// Node id of the target directory (the source is the request's node).
        pub newdir: u64,
    }

    /// RENAME2 request (7.23); the old name and the new name follow it.
    pub struct fuse_rename2_in {
        pub newdir: u64,
        /// RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
        pub flags: u32,
        pub padding: u32,
    }

    /// LINK request; the new name follows it (the directory is the request's node).
    pub struct fuse_link_in {
        /// Node id of the existing inode to link.
        pub oldnodeid: u64,
    }

    /// CREATE and TMPFILE request; the new entry's name follows it.
    pub struct fuse_create_in {
        /// open(2) flags, O_NOCTTY removed.
        pub flags: u32,
        pub mode: u32,
        pub umask: u32,
        /// FUSE_OPEN_KILL_SUIDGID.
        pub open_flags: u32,
    }

    /// SETXATTR request (16 bytes with FUSE_SETXATTR_EXT, else the first 8);
    /// the name, then `size` bytes of value follow it.
    pub struct fuse_setxattr_in {
        pub size: u32,
        /// XATTR_CREATE, XATTR_REPLACE.
        pub flags: u32,
        /// FUSE_SETXATTR_ACL_KILL_SGID (7.33, only with FUSE_SETXATTR_EXT).
        pub setxattr_flags: u32,
        pub padding: u32,
    }

    /// GETXATTR request (the name follows it) and LISTXATTR request.
    pub struct fuse_getxattr_in {
        /// Size of the caller's buffer; 0 asks for the size only.
        pub size: u32,
        pub padding: u32,
    }

    /// GETXATTR / LISTXATTR reply to a request of `size` 0.
    pub struct fuse_getxattr_out {
        pub size: u32,
        pub padding: u32,
    }

    /// GETLK, SETLK and SETLKW request.
    pub struct fuse_lk_in {
        pub fh: u64,
        pub owner: u64,
        pub lk: fuse_file_lock,
        /// FUSE_LK_FLOCK: a BSD flock(2) lock, not a POSIX one.
        pub lk_flags: u32,
        pub padding: u32,
    }

    /// GETLK reply.
    pub struct fuse_lk_out {
        pub lk: fuse_file_lock,
    }

    /// ACCESS request.
    pub struct fuse_access_in {
        /// R_OK, W_OK, X_OK (F_OK is 0).
        pub mask: u32,
        pub padding: u32,
    }

    /// One READDIR record, without its name: `namelen` name bytes follow,
    /// then zeros up to the next multiple of 8 ([`FUSE_DIRENT_ALIGN`]).
    pub struct fuse_dirent {
        pub ino: u64,
        /// Cookie of the next record: the `offset` of the READDIR that continues
        /// after this entry.
        pub off: u64,
        pub namelen: u32,
        /// `DT_*`, i.e. `(mode & S_IFMT) >> 12`.
        pub r#type: u32,
    }

    /// One READDIRPLUS record: the entry (as LOOKUP answers it), then the dirent.
    pub struct fuse_direntplus {
        /// `nodeid` 0 means "no entry, only the name" (the kernel creates no inode).
        pub entry_out: fuse_entry_out,
        pub dirent: fuse_dirent,
    }

    /// COPY_FILE_RANGE and COPY_FILE_RANGE_64 request.
    pub struct fuse_copy_file_range_in {
        pub fh_in: u64,
        pub off_in: u64,
        pub nodeid_out: u64,
        pub fh_out: u64,
        pub off_out: u64,
        pub len: u64,
        pub flags: u64,
    }

    /// COPY_FILE_RANGE_64 reply (7.45; COPY_FILE_RANGE answers `fuse_write_out`).
    pub struct fuse_copy_file_range_out {
        pub bytes_copied: u64,
    }

    /// POLL request.
    pub struct fuse_poll_in {
        pub fh: u64,
        /// Kernel handle to quote in a FUSE_NOTIFY_POLL wakeup.
        pub kh: u64,
        /// FUSE_POLL_SCHEDULE_NOTIFY.
        pub flags: u32,
        /// POLLIN, POLLOUT... requested (7.21).
        pub events: u32,
    }

    /// POLL reply.
    pub struct fuse_poll_out {
        pub revents: u32,
        pub padding: u32,
    }

    /// SYNCFS request.
    pub struct fuse_syncfs_in {
        pub padding: u64,
    }
}

/// Offset of the name in a `fuse_dirent` record (`FUSE_NAME_OFFSET`).
pub const FUSE_NAME_OFFSET: usize = core::mem::size_of::<fuse_dirent>();
/// Offset of the name in a `fuse_direntplus` record (`FUSE_NAME_OFFSET_DIRENTPLUS`).
pub const FUSE_NAME_OFFSET_DIRENTPLUS: usize = core::mem::size_of::<fuse_direntplus>();

/// `FUSE_DIRENT_ALIGN(x)`: `x` rounded up to a multiple of 8, the alignment
/// of every READDIR and READDIRPLUS record.
pub const fn FUSE_DIRENT_ALIGN(x: usize) -> usize {
    (x + 7) & !7
}
