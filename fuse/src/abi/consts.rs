//! Version numbers, opcodes and flag bits, with the kernel's names and values.

/// Major version of the protocol; the only one Linux has ever spoken.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// Minor version this crate implements (kernel header of Linux 6.18).
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// Node id of the file system's root, the node at the mountpoint: the one id
/// the kernel knows without a LOOKUP.
pub const FUSE_ROOT_ID: u64 = 1;
/// Smallest read buffer the kernel accepts, whatever `max_write` is.
pub const FUSE_MIN_READ_BUFFER: usize = 8192;
/// Size of `fuse_init_out` before 7.5 (major and minor only).
pub const FUSE_COMPAT_INIT_OUT_SIZE: usize = 8;
/// Size of `fuse_init_out` from 7.5 to 7.22.
pub const FUSE_COMPAT_22_INIT_OUT_SIZE: usize = 24;
/// Size of `fuse_init_in` before 7.36 added `flags2` and padding.
pub const FUSE_COMPAT_INIT_IN_SIZE: usize = 16;
/// Size of `fuse_setxattr_in` unless FUSE_SETXATTR_EXT was negotiated (7.33).
pub const FUSE_COMPAT_SETXATTR_IN_SIZE: usize = 8;
/// Size of `fuse_mknod_in` before 7.12 added `umask` (such kernels are refused).
pub const FUSE_COMPAT_MKNOD_IN_SIZE: usize = 8;
/// Longest name the kernel sends or accepts in a directory record. Not in the
/// uapi header: `fs/fuse/fuse_i.h` (unchanged since 2.6.14 up to Linux 6.18).
pub const FUSE_NAME_MAX: usize = 1024;
/// `uid`/`gid` of a request whose caller has no mapping in the mount's user namespace.
pub const FUSE_INVALID_UIDGID: u32 = u32::MAX;

// enum fuse_opcode: the kernel's request types.
/// Look up a name in a directory.
pub const FUSE_LOOKUP: u32 = 1;
/// Drop lookup references to an inode (no reply).
pub const FUSE_FORGET: u32 = 2;
/// Get attributes.
pub const FUSE_GETATTR: u32 = 3;
/// Set attributes (truncate, chmod, utimes...).
pub const FUSE_SETATTR: u32 = 4;
/// Read a symlink.
pub const FUSE_READLINK: u32 = 5;
/// Create a symlink.
pub const FUSE_SYMLINK: u32 = 6;
/// Create a node.
pub const FUSE_MKNOD: u32 = 8;
/// Create a directory.
pub const FUSE_MKDIR: u32 = 9;
/// Remove a file.
pub const FUSE_UNLINK: u32 = 10;
/// Remove a directory.
pub const FUSE_RMDIR: u32 = 11;
/// Rename.
pub const FUSE_RENAME: u32 = 12;
/// Create a hard link.
pub const FUSE_LINK: u32 = 13;
/// Open a file.
pub const FUSE_OPEN: u32 = 14;
/// Read data.
pub const FUSE_READ: u32 = 15;
/// Write data.
pub const FUSE_WRITE: u32 = 16;
/// Get file system statistics.
pub const FUSE_STATFS: u32 = 17;
/// Last close of an open file.
pub const FUSE_RELEASE: u32 = 18;
/// Synchronise file contents.
pub const FUSE_FSYNC: u32 = 20;
/// Set an extended attribute.
pub const FUSE_SETXATTR: u32 = 21;
/// Get an extended attribute.
pub const FUSE_GETXATTR: u32 = 22;
/// List extended attributes.
pub const FUSE_LISTXATTR: u32 = 23;
/// Remove an extended attribute.
pub const FUSE_REMOVEXATTR: u32 = 24;
/// Every close(2) of a file descriptor.
pub const FUSE_FLUSH: u32 = 25;
/// Protocol handshake, always the first request.
pub const FUSE_INIT: u32 = 26;
/// Open a directory.
pub const FUSE_OPENDIR: u32 = 27;
/// Read a directory.
pub const FUSE_READDIR: u32 = 28;
/// Close a directory.
pub const FUSE_RELEASEDIR: u32 = 29;
/// Synchronise a directory.
pub const FUSE_FSYNCDIR: u32 = 30;
/// Test a POSIX lock.
pub const FUSE_GETLK: u32 = 31;
/// Set a POSIX lock.
pub const FUSE_SETLK: u32 = 32;
/// Set a POSIX lock, waiting.
pub const FUSE_SETLKW: u32 = 33;
/// Check access permissions.
pub const FUSE_ACCESS: u32 = 34;
/// Create and open a file.
pub const FUSE_CREATE: u32 = 35;
/// Interrupt an outstanding request.
pub const FUSE_INTERRUPT: u32 = 36;
/// Map a block (fuseblk only).
pub const FUSE_BMAP: u32 = 37;
/// Clean up the file system (sent for fuseblk mounts, not for plain `fuse`).
pub const FUSE_DESTROY: u32 = 38;
/// ioctl(2) on a file.
pub const FUSE_IOCTL: u32 = 39;
/// poll(2) on a file.
pub const FUSE_POLL: u32 = 40;
/// Reply to a NOTIFY_RETRIEVE.
pub const FUSE_NOTIFY_REPLY: u32 = 41;
/// Notification code (in `fuse_out_header::error`, `unique` 0): drop an inode's cached
/// attributes and, for `off >= 0`, its cached pages in a range
/// ([`fuse_notify_inval_inode_out`](super::fuse_notify_inval_inode_out)).
pub const FUSE_NOTIFY_INVAL_INODE: i32 = 2;
/// Several FORGETs in one request (no reply).
pub const FUSE_BATCH_FORGET: u32 = 42;
/// fallocate(2): preallocate, punch holes, zero ranges.
pub const FUSE_FALLOCATE: u32 = 43;
/// Read a directory with attributes.
pub const FUSE_READDIRPLUS: u32 = 44;
/// Rename with flags.
pub const FUSE_RENAME2: u32 = 45;
/// lseek(2) with SEEK_DATA / SEEK_HOLE.
pub const FUSE_LSEEK: u32 = 46;
/// copy_file_range(2).
pub const FUSE_COPY_FILE_RANGE: u32 = 47;
/// DAX: set up a mapping (virtiofs).
pub const FUSE_SETUPMAPPING: u32 = 48;
/// DAX: remove mappings (virtiofs).
pub const FUSE_REMOVEMAPPING: u32 = 49;
/// syncfs(2).
pub const FUSE_SYNCFS: u32 = 50;
/// O_TMPFILE creation.
pub const FUSE_TMPFILE: u32 = 51;
/// statx(2) with extended attributes; ENOSYS makes the kernel use GETATTR.
pub const FUSE_STATX: u32 = 52;
/// copy_file_range(2) with a 64-bit result (7.45).
pub const FUSE_COPY_FILE_RANGE_64: u32 = 53;
/// CUSE handshake.
pub const CUSE_INIT: u32 = 4096;

/// `unique` bit 0: the request is an INTERRUPT (its `unique` is the target's | 1).
pub const FUSE_INT_REQ_BIT: u64 = 1 << 0;
/// `unique` bit 63: the kernel resent this request (FUSE_HAS_RESEND).
pub const FUSE_UNIQUE_RESEND: u64 = 1 << 63;

// INIT flags, bits 0..31 in `flags`, bits 32..63 in `flags2` (with FUSE_INIT_EXT).
/// Reads may be sent in parallel, also for the same file.
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
/// Remote POSIX locking.
pub const FUSE_POSIX_LOCKS: u64 = 1 << 1;
/// Kernel sends a file handle for fstat (unused).
pub const FUSE_FILE_OPS: u64 = 1 << 2;
/// The server handles O_TRUNC in OPEN.
pub const FUSE_ATOMIC_O_TRUNC: u64 = 1 << 3;
/// The server handles lookups of "." and "..".
pub const FUSE_EXPORT_SUPPORT: u64 = 1 << 4;
/// Writes may be larger than 4 KiB (up to `max_write`).
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
/// Don't apply the umask on create.
pub const FUSE_DONT_MASK: u64 = 1 << 6;
/// Kernel supports splice writes to the device.
pub const FUSE_SPLICE_WRITE: u64 = 1 << 7;
/// Kernel supports splice moves on the device.
pub const FUSE_SPLICE_MOVE: u64 = 1 << 8;
/// Kernel supports splice reads from the device.
pub const FUSE_SPLICE_READ: u64 = 1 << 9;
/// Remote BSD flock locking.
pub const FUSE_FLOCK_LOCKS: u64 = 1 << 10;
/// Kernel supports ioctl on directories.
pub const FUSE_HAS_IOCTL_DIR: u64 = 1 << 11;
/// Invalidate cached pages when mtime or size change.
pub const FUSE_AUTO_INVAL_DATA: u64 = 1 << 12;
/// READDIRPLUS instead of READDIR.
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
/// Adaptive READDIRPLUS.
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
/// Asynchronous direct I/O: several requests in flight for one O_DIRECT call.
pub const FUSE_ASYNC_DIO: u64 = 1 << 15;
/// Writeback caching of buffered writes.
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
/// Kernel supports zero-message opens (ENOSYS to OPEN).
pub const FUSE_NO_OPEN_SUPPORT: u64 = 1 << 17;
/// Parallel lookups and readdir in one directory.
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
/// The server kills suid/sgid/caps on write, chown and truncate.
pub const FUSE_HANDLE_KILLPRIV: u64 = 1 << 19;
/// The server supports POSIX ACLs.
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
/// Reading the device after an abort fails with ECONNABORTED, not ENODEV.
pub const FUSE_ABORT_ERROR: u64 = 1 << 21;
/// `fuse_init_out::max_pages` is valid.
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
/// Cache READLINK replies.
pub const FUSE_CACHE_SYMLINKS: u64 = 1 << 23;
/// Kernel supports zero-message opendir.
pub const FUSE_NO_OPENDIR_SUPPORT: u64 = 1 << 24;
/// Invalidate cached pages only on explicit request.
pub const FUSE_EXPLICIT_INVAL_DATA: u64 = 1 << 25;
/// `fuse_init_out::map_alignment` is valid (DAX).
pub const FUSE_MAP_ALIGNMENT: u64 = 1 << 26;
/// Kernel supports auto-mounting submounts.
pub const FUSE_SUBMOUNTS: u64 = 1 << 27;
/// Like HANDLE_KILLPRIV, with VFS semantics.
pub const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
/// Extended `fuse_setxattr_in`.
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
/// `fuse_init_in::flags2` / `fuse_init_out::flags2` carry bits 32..63.
pub const FUSE_INIT_EXT: u64 = 1 << 30;
/// Reserved, never set.
pub const FUSE_INIT_RESERVED: u64 = 1 << 31;
/// Security context on create, mkdir, symlink, mknod.
pub const FUSE_SECURITY_CTX: u64 = 1 << 32;
/// Per-inode DAX.
pub const FUSE_HAS_INODE_DAX: u64 = 1 << 33;
/// Supplementary group on create, mkdir, symlink, mknod.
pub const FUSE_CREATE_SUPP_GROUP: u64 = 1 << 34;
/// Kernel supports expire-only entry invalidation.
pub const FUSE_HAS_EXPIRE_ONLY: u64 = 1 << 35;
/// Shared mmap allowed in FOPEN_DIRECT_IO mode.
pub const FUSE_DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
/// Passthrough I/O to a backing file.
pub const FUSE_PASSTHROUGH: u64 = 1 << 37;
/// Explicitly disable export support.
pub const FUSE_NO_EXPORT_SUPPORT: u64 = 1 << 38;
/// Kernel may resend pending requests (`unique` bit 63).
pub const FUSE_HAS_RESEND: u64 = 1 << 39;
/// Idmapped mounts allowed.
pub const FUSE_ALLOW_IDMAP: u64 = 1 << 40;
/// FUSE over io_uring (offered only with `enable_uring=Y`, since 6.14).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
/// `fuse_init_out::request_timeout` is valid.
pub const FUSE_REQUEST_TIMEOUT: u64 = 1 << 42;

// FOPEN_*: flags in fuse_open_out::open_flags.
/// Bypass the page cache for this open file.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
/// Don't invalidate the data cache on open.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// The file is not seekable.
pub const FOPEN_NONSEEKABLE: u32 = 1 << 2;
/// Allow caching this directory.
pub const FOPEN_CACHE_DIR: u32 = 1 << 3;
/// The file is stream-like (no file position).
pub const FOPEN_STREAM: u32 = 1 << 4;
/// Don't flush the data cache on close.
pub const FOPEN_NOFLUSH: u32 = 1 << 5;
/// Direct writes need not take the inode lock: they may run in parallel.
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;
/// Passthrough I/O for this open file.
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;

// FATTR_*: bits of fuse_setattr_in::valid.
/// `mode` is valid.
pub const FATTR_MODE: u32 = 1 << 0;
/// `uid` is valid.
pub const FATTR_UID: u32 = 1 << 1;
/// `gid` is valid.
pub const FATTR_GID: u32 = 1 << 2;
/// `size` is valid (truncate).
pub const FATTR_SIZE: u32 = 1 << 3;
/// `atime` is valid.
pub const FATTR_ATIME: u32 = 1 << 4;
/// `mtime` is valid.
pub const FATTR_MTIME: u32 = 1 << 5;
/// `fh` is valid.
pub const FATTR_FH: u32 = 1 << 6;
/// Set atime to now.
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
/// Set mtime to now.
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
/// `lock_owner` is valid.
pub const FATTR_LOCKOWNER: u32 = 1 << 9;
/// `ctime` is valid.
pub const FATTR_CTIME: u32 = 1 << 10;
/// Kill suid and sgid.
pub const FATTR_KILL_SUIDGID: u32 = 1 << 11;

// Small per-request flag sets.
/// fuse_getattr_in::getattr_flags: `fh` is valid.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;
/// fuse_release_in::release_flags: flush before release.
pub const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
/// fuse_release_in::release_flags: unlock BSD locks.
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// fuse_write_in::write_flags: delayed write from the page cache.
pub const FUSE_WRITE_CACHE: u32 = 1 << 0;
/// fuse_write_in::write_flags: `lock_owner` is valid.
pub const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
/// fuse_write_in::write_flags: kill suid and sgid.
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// fuse_read_in::read_flags: `lock_owner` is valid.
pub const FUSE_READ_LOCKOWNER: u32 = 1 << 1;
/// fuse_fsync_in::fsync_flags: data only (fdatasync).
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;
/// fuse_open_in::open_flags: kill suid and sgid if executable.
pub const FUSE_OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// fuse_lk_in::lk_flags: a BSD flock(2) lock (needs FUSE_FLOCK_LOCKS).
pub const FUSE_LK_FLOCK: u32 = 1 << 0;
/// fuse_setxattr_in::setxattr_flags: clear SGID when setting a POSIX ACL.
pub const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
/// fuse_poll_in::flags: the server should send a FUSE_NOTIFY_POLL wakeup.
pub const FUSE_POLL_SCHEDULE_NOTIFY: u32 = 1 << 0;
/// fuse_attr::flags: the object is a submount root (FUSE_SUBMOUNTS).
pub const FUSE_ATTR_SUBMOUNT: u32 = 1 << 0;
/// fuse_attr::flags: DAX for this inode (FUSE_HAS_INODE_DAX).
pub const FUSE_ATTR_DAX: u32 = 1 << 1;

// renameat2(2) flags in fuse_rename2_in::flags, from <linux/fs.h>.
/// Fail with EEXIST if the new name exists.
pub const RENAME_NOREPLACE: u32 = 1 << 0;
/// Exchange the two names atomically.
pub const RENAME_EXCHANGE: u32 = 1 << 1;
/// Leave a whiteout at the old name (overlayfs).
pub const RENAME_WHITEOUT: u32 = 1 << 2;

// Device ioctls: _IOR(229, 0, uint32_t) etc., spelled out (checked in tests).
/// `ioctl(new_fd, FUSE_DEV_IOC_CLONE, &session_fd)`: attach a fresh /dev/fuse
/// fd to an existing session (an extra queue).
pub const FUSE_DEV_IOC_CLONE: u32 = 0x8004_E500;
/// `_IOW(229, 1, struct fuse_backing_map)`: register a backing file for FUSE
/// passthrough; returns its backing id (Linux 6.9+, CAP_SYS_ADMIN).
pub const FUSE_DEV_IOC_BACKING_OPEN: u32 = 0x4010_E501;
/// `_IOW(229, 2, uint32_t)`: unregister a backing id.
pub const FUSE_DEV_IOC_BACKING_CLOSE: u32 = 0x4004_E502;
/// `_IO(229, 3)`: make INIT synchronous with mount (Linux 6.18+; unused here).
pub const FUSE_DEV_IOC_SYNC_INIT: u32 = 0x0000_E503;
/// `max_stack_depth` for FUSE passthrough: backing files on a file system that is
/// not itself stacked, and one file system (overlayfs) may stack over this mount.
pub const FUSE_BACKING_STACKED_UNDER: u32 = 1;

// FUSE over io_uring.
/// Size of `fuse_uring_req_header::in_out`.
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
/// Size of `fuse_uring_req_header::op_in`.
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;
/// `cmd_op` of IORING_OP_URING_CMD: register a buffer and fetch a request.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
/// `cmd_op` of IORING_OP_URING_CMD: commit a reply and fetch the next request.
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
