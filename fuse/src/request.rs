//! A decoded request: header fields plus an [`Operation`] that borrows the
//! request buffer.
//!
//! The operations are those on a node's data and attributes and those on
//! names, listings, xattrs, locks, copy_file_range and poll: a file system
//! serves the ones it has. Everything else decodes as [`Operation::Unknown`],
//! which a server answers with ENOSYS (ioctl, bmap, DAX mappings, CUSE...), as
//! it answers the known operations it does not serve. Names are `&CStr`
//! borrowed from the request, NUL included (see [`crate::decode`] "Names").
//! Build a `Request` with [`Request::decode`]; its `Display`
//! ([`crate::display`]) gives one log line per request, e.g.
//! `FUSE(  42) READ fh=1 off=4096 len=4096`.

use crate::abi::*;
use crate::kind::OpKind;
use std::ffi::CStr;
use std::io::IoSlice;

/// One request from the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Id to echo in the reply. Bit 0 set means an INTERRUPT request.
    pub unique: u64,
    /// The node the request is about: [`FUSE_ROOT_ID`] for the file system's
    /// root, else an id the file system gave in an entry reply (LOOKUP,
    /// CREATE, MKDIR...) and the kernel has not forgotten; 0 in requests about
    /// no node (INIT, INTERRUPT, BATCH_FORGET).
    pub nodeid: u64,
    /// Caller's effective uid.
    pub uid: u32,
    /// Caller's effective gid.
    pub gid: u32,
    /// Caller's thread group id (0 for requests the kernel makes itself).
    pub pid: u32,
    /// Total length of the request in bytes.
    pub len: u32,
    /// Raw opcode (also for [`Operation::Unknown`]).
    pub opcode: u32,
    /// The decoded arguments.
    pub op: Operation<'a>,
}

/// The operation and its arguments, borrowed from the request buffer.
///
/// Not `#[non_exhaustive]`: servers match it exhaustively, so that an operation added
/// here fails to compile wherever it is not yet decided ([`crate::kind`]).
#[derive(Debug, Clone, Copy)]
pub enum Operation<'a> {
    /// Handshake; copied and zero-extended (older kernels send 8 or 16 bytes).
    Init {
        /// Kernel's version, limits and offered flags.
        arg: fuse_init_in,
    },
    /// stat(2).
    Getattr {
        /// Flags and file handle.
        arg: &'a fuse_getattr_in,
    },
    /// truncate(2), chmod(2), utimes(2)...
    Setattr {
        /// FATTR_* bits in `valid` say which fields to apply.
        arg: &'a fuse_setattr_in,
    },
    /// open(2).
    Open {
        /// open(2) flags.
        arg: &'a fuse_open_in,
    },
    /// Last close of an open file.
    Release {
        /// File handle from OPEN.
        arg: &'a fuse_release_in,
    },
    /// Every close(2).
    Flush {
        /// File handle from OPEN.
        arg: &'a fuse_flush_in,
    },
    /// fsync(2) / fdatasync(2).
    Fsync {
        /// FUSE_FSYNC_FDATASYNC in `fsync_flags` means fdatasync.
        arg: &'a fuse_fsync_in,
    },
    /// Read `arg.size` bytes at `arg.offset`.
    Read {
        /// Offset, size, file handle.
        arg: &'a fuse_read_in,
    },
    /// Write `data` at `arg.offset`.
    Write {
        /// Offset, size, file handle.
        arg: &'a fuse_write_in,
        /// The payload, possibly split between head and tail.
        data: WriteData<'a>,
    },
    /// fallocate(2).
    Fallocate {
        /// Mode, offset, length.
        arg: &'a fuse_fallocate_in,
    },
    /// lseek(2) with SEEK_DATA or SEEK_HOLE.
    Lseek {
        /// Offset and whence.
        arg: &'a fuse_lseek_in,
    },
    /// statfs(2).
    Statfs,
    /// Name lookup in directory `nodeid`: reply an entry, or ENOENT (see
    /// [`crate::Reply::entry`] for a negative entry the kernel may cache).
    Lookup {
        /// The name.
        name: &'a CStr,
    },
    /// Interrupt request `arg.unique` (reply optional; ENOSYS stops them).
    Interrupt {
        /// The request to interrupt.
        arg: &'a fuse_interrupt_in,
    },
    /// statx(2) (7.39+); ENOSYS makes the kernel fall back to GETATTR.
    Statx {
        /// Requested mask and flags.
        arg: &'a fuse_statx_in,
    },
    /// Drop lookup references (no reply).
    Forget {
        /// Number of lookups to forget.
        arg: &'a fuse_forget_in,
    },
    /// Several FORGETs (no reply).
    BatchForget {
        /// Count of entries.
        arg: &'a fuse_batch_forget_in,
        /// The entries.
        nodes: &'a [fuse_forget_one],
    },
    /// File system teardown (fuseblk only; a plain `fuse` mount sends none).
    Destroy,
    /// readlink(2): reply with the target, without NUL.
    Readlink,
    /// symlink(2): create `name` in `nodeid`, pointing to `target`.
    Symlink {
        /// The new entry (sent first).
        name: &'a CStr,
        /// What the link points to (sent second).
        target: &'a CStr,
    },
    /// mknod(2) in directory `nodeid`.
    Mknod {
        /// Mode (file type included), rdev, umask.
        arg: &'a fuse_mknod_in,
        /// The new entry.
        name: &'a CStr,
    },
    /// mkdir(2) in directory `nodeid`.
    Mkdir {
        /// Mode and umask.
        arg: &'a fuse_mkdir_in,
        /// The new directory.
        name: &'a CStr,
    },
    /// unlink(2) of `name` in directory `nodeid`.
    Unlink {
        /// The entry to remove.
        name: &'a CStr,
    },
    /// rmdir(2) of `name` in directory `nodeid`.
    Rmdir {
        /// The directory to remove.
        name: &'a CStr,
    },
    /// rename(2): `name` in `nodeid` to `newname` in `arg.newdir`.
    Rename {
        /// The target directory.
        arg: &'a fuse_rename_in,
        /// The old name (sent first).
        name: &'a CStr,
        /// The new name (sent second).
        newname: &'a CStr,
    },
    /// renameat2(2) with flags (7.23); the kernel sends RENAME when flags are 0.
    Rename2 {
        /// The target directory and RENAME_* flags.
        arg: &'a fuse_rename2_in,
        /// The old name (sent first).
        name: &'a CStr,
        /// The new name (sent second).
        newname: &'a CStr,
    },
    /// link(2): a new name `newname` in directory `nodeid` for `arg.oldnodeid`.
    Link {
        /// The existing inode.
        arg: &'a fuse_link_in,
        /// The new name.
        newname: &'a CStr,
    },
    /// open(2) with O_CREAT in directory `nodeid`: reply entry + open.
    Create {
        /// Open flags, mode, umask.
        arg: &'a fuse_create_in,
        /// The entry to create or open.
        name: &'a CStr,
    },
    /// open(2) with O_TMPFILE in directory `nodeid` (7.37): reply entry + open.
    Tmpfile {
        /// Open flags, mode, umask.
        arg: &'a fuse_create_in,
        /// The anonymous dentry's name ("/" in Linux 6.x): ignore it.
        name: &'a CStr,
    },
    /// opendir(3).
    Opendir {
        /// open(2) flags.
        arg: &'a fuse_open_in,
    },
    /// getdents(2): reply with `fuse_dirent` records ([`crate::reply::ReaddirBuf`]).
    Readdir {
        /// `fh`, `offset` (a cookie: 0 or the `off` of an earlier record), `size`.
        arg: &'a fuse_read_in,
    },
    /// getdents(2) with attributes (FUSE_DO_READDIRPLUS): `fuse_direntplus` records.
    Readdirplus {
        /// As for [`Operation::Readdir`].
        arg: &'a fuse_read_in,
    },
    /// Last close of an open directory.
    Releasedir {
        /// File handle from OPENDIR.
        arg: &'a fuse_release_in,
    },
    /// fsync(2) of a directory.
    Fsyncdir {
        /// File handle from OPENDIR, FUSE_FSYNC_FDATASYNC.
        arg: &'a fuse_fsync_in,
    },
    /// setxattr(2).
    Setxattr {
        /// Copied and zero-extended: 8 bytes on the wire without FUSE_SETXATTR_EXT.
        arg: fuse_setxattr_in,
        /// The attribute's name.
        name: &'a CStr,
        /// `arg.size` bytes of value, possibly split between head and tail.
        value: WriteData<'a>,
    },
    /// getxattr(2): `arg.size` 0 asks for the value's size only.
    Getxattr {
        /// Size of the caller's buffer.
        arg: &'a fuse_getxattr_in,
        /// The attribute's name.
        name: &'a CStr,
    },
    /// listxattr(2): `arg.size` 0 asks for the list's size only.
    Listxattr {
        /// Size of the caller's buffer.
        arg: &'a fuse_getxattr_in,
    },
    /// removexattr(2).
    Removexattr {
        /// The attribute's name.
        name: &'a CStr,
    },
    /// access(2) (not sent with `default_permissions`).
    Access {
        /// R_OK | W_OK | X_OK, or 0 for F_OK.
        arg: &'a fuse_access_in,
    },
    /// F_GETLK (or F_OFD_GETLK): reply `fuse_lk_out`.
    Getlk {
        /// File handle, owner, range.
        arg: &'a fuse_lk_in,
    },
    /// F_SETLK, or flock(2) with LOCK_NB when `arg.lk_flags` has FUSE_LK_FLOCK.
    Setlk {
        /// File handle, owner, range.
        arg: &'a fuse_lk_in,
    },
    /// F_SETLKW (waits), or a blocking flock(2).
    Setlkw {
        /// File handle, owner, range.
        arg: &'a fuse_lk_in,
    },
    /// copy_file_range(2) (7.28): reply `fuse_write_out`.
    CopyFileRange {
        /// Both files and ranges.
        arg: &'a fuse_copy_file_range_in,
    },
    /// copy_file_range(2) with a 64-bit result (7.45): reply `fuse_copy_file_range_out`.
    CopyFileRange64 {
        /// Both files and ranges.
        arg: &'a fuse_copy_file_range_in,
    },
    /// poll(2).
    Poll {
        /// File handle, kernel handle, events.
        arg: &'a fuse_poll_in,
    },
    /// syncfs(2) (7.34).
    Syncfs {
        /// Padding only.
        arg: &'a fuse_syncfs_in,
    },
    /// Any other opcode: reply ENOSYS.
    Unknown {
        /// The raw opcode.
        opcode: u32,
    },
}

/// A WRITE payload or SETXATTR value: the part in the in-place head, then the
/// part in the tail.
#[derive(Debug, Clone, Copy)]
pub struct WriteData<'a> {
    head: &'a [u8],
    tail: &'a [u8],
}

impl<'a> WriteData<'a> {
    /// A payload of `head` followed by `tail`.
    pub fn new(head: &'a [u8], tail: &'a [u8]) -> Self {
        WriteData { head, tail }
    }

    /// Total payload length.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// True for an empty write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The two parts, in order; either may be empty.
    pub fn parts(&self) -> (&'a [u8], &'a [u8]) {
        (self.head, self.tail)
    }

    /// True if the payload continued into the spill-over buffer.
    pub fn uses_tail(&self) -> bool {
        !self.tail.is_empty()
    }

    /// The parts as iovecs for pwritev(2) or an io_uring writev.
    pub fn io_slices(&self) -> [IoSlice<'a>; 2] {
        [IoSlice::new(self.head), IoSlice::new(self.tail)]
    }

    /// Copies the payload into the start of `dst`; returns the bytes copied.
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        let n = self.head.len().min(dst.len());
        dst[..n].copy_from_slice(&self.head[..n]);
        let m = self.tail.len().min(dst.len() - n);
        dst[n..n + m].copy_from_slice(&self.tail[..m]);
        n + m
    }
}

impl<'a> Request<'a> {
    pub(crate) fn from_parts(h: &fuse_in_header, op: Operation<'a>) -> Self {
        let fuse_in_header {
            unique,
            nodeid,
            uid,
            gid,
            pid,
            len,
            opcode,
            ..
        } = *h;
        Request {
            unique,
            nodeid,
            uid,
            gid,
            pid,
            len,
            opcode,
            op,
        }
    }

    /// False for requests the kernel does not wait on: FORGET, BATCH_FORGET
    /// and INTERRUPT (which may still be answered with ENOSYS or EAGAIN).
    pub fn expects_reply(&self) -> bool {
        self.op.kind().replies()
    }
}

/// False for opcodes the kernel expects no reply to ([`OpKind::replies`]).
pub fn expects_reply(opcode: u32) -> bool {
    OpKind::from_opcode(opcode).replies()
}
