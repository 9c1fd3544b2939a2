//! A decoded request: header fields plus an [`Operation`] that borrows the
//! request buffer.
//!
//! The operations are the ones a single-file export serves. Everything else
//! decodes as [`Operation::Unknown`], which a server answers with ENOSYS
//! (directory operations, xattrs, locks, ioctl...). Build a `Request` with
//! [`Request::decode`]; its `Display` ([`crate::display`]) gives one log
//! line per request, e.g. `FUSE(  42) READ fh=1 off=4096 len=4096`.

use crate::abi::*;
use std::ffi::OsStr;
use std::io::IoSlice;

/// One request from the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Id to echo in the reply. Bit 0 set means an INTERRUPT request.
    pub unique: u64,
    /// Inode the request is about; [`FUSE_ROOT_ID`] for the exported file.
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
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
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
    /// Name lookup; for a single-file export always ENOENT.
    Lookup {
        /// The name, without its NUL.
        name: &'a OsStr,
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
    /// Any other opcode: reply ENOSYS.
    Unknown {
        /// The raw opcode.
        opcode: u32,
    },
}

/// A WRITE payload: the part in the in-place head, then the part in the tail.
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
        expects_reply(self.opcode)
    }
}

/// False for opcodes the kernel expects no reply to; see [`Request::expects_reply`].
pub fn expects_reply(opcode: u32) -> bool {
    !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT)
}
