//! Replies as iovecs: a `fuse_out_header` computed from the payload, followed
//! by the payload slices, never copied.
//!
//! # Contract
//!
//! - A reply is written with one `writev(2)` (or one io_uring writev) to the
//!   fd its request was read from. The kernel checks that `header.len` equals
//!   the bytes written, and that `error` is 0 or in -511..=-1 ([`Errno`]
//!   guarantees the range). An error reply carries no payload.
//! - A write that fails with ENOENT means the request is gone: it was
//!   interrupted and already answered, or the connection was aborted. That is
//!   not a bug in the server, so [`send`] returns `Ok(Sent::Gone)` for it
//!   instead of an error. ENODEV means the file system was unmounted: stop.
//! - Building a reply does not allocate. [`Reply::io_slices`] gives the iovec
//!   array for transports that submit the write themselves. Argument structs
//!   are borrowed from the caller, like data: a reply lives no longer than
//!   the storage it points to.
//! - Directory listings are packed into the caller's (page-aligned) data
//!   buffer by [`ReaddirBuf`] and [`ReaddirPlusBuf`], then sent as data.

mod dirents;

pub use dirents::{dirent_type, Listing, Plain, Plus, Pushed, ReaddirBuf, ReaddirPlusBuf};

use crate::abi::{fuse_entry_out, fuse_getxattr_out, fuse_open_out, fuse_out_header};
use crate::dev::FuseDev;
use crate::errno::Errno;
use core::mem::size_of;
use std::io::{self, IoSlice};
use zerocopy::{Immutable, IntoBytes};

/// Most payload slices a [`Reply`] can carry (e.g. a header struct + 2 data parts).
pub const MAX_PAYLOAD_SLICES: usize = 3;

/// Size of `fuse_out_header`.
const OUT_HEADER_LEN: usize = size_of::<fuse_out_header>();

/// The header for a reply to `unique` carrying `payload_len` bytes.
///
/// `error` is `None` for success. A length beyond `u32::MAX` cannot occur for
/// replies within `max_read`; it saturates, and the kernel rejects the write.
pub fn out_header(unique: u64, error: Option<Errno>, payload_len: usize) -> fuse_out_header {
    let len = OUT_HEADER_LEN.saturating_add(payload_len);
    fuse_out_header {
        len: u32::try_from(len).unwrap_or(u32::MAX),
        error: error.map_or(0, Errno::to_reply),
        unique,
    }
}

/// A reply ready to be written: the header and up to [`MAX_PAYLOAD_SLICES`]
/// borrowed payload slices.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    header: fuse_out_header,
    payload: [&'a [u8]; MAX_PAYLOAD_SLICES],
}

impl<'a> Reply<'a> {
    /// A success reply whose payload is the `N` slices, in order.
    pub fn with_payload<const N: usize>(unique: u64, parts: [&'a [u8]; N]) -> Self {
        const {
            assert!(
                N <= MAX_PAYLOAD_SLICES,
                "too many payload slices for a Reply"
            )
        };
        let mut payload: [&'a [u8]; MAX_PAYLOAD_SLICES] = [&[]; MAX_PAYLOAD_SLICES];
        payload[..N].copy_from_slice(&parts);
        let len = parts.iter().map(|p| p.len()).sum();
        Reply {
            header: out_header(unique, None, len),
            payload,
        }
    }

    /// A success reply without payload (FLUSH, RELEASE, FSYNC, ...).
    pub fn empty(unique: u64) -> Self {
        Reply::with_payload(unique, [])
    }

    /// An error reply: header only, `error = -errno`.
    pub fn error(unique: u64, errno: Errno) -> Self {
        let header = out_header(unique, Some(errno), 0);
        Reply {
            header,
            payload: [&[]; MAX_PAYLOAD_SLICES],
        }
    }

    /// A success reply carrying one argument struct (`fuse_attr_out`, ...).
    pub fn arg<T: IntoBytes + Immutable>(unique: u64, arg: &'a T) -> Self {
        Reply::with_payload(unique, [arg.as_bytes()])
    }

    /// A READ reply: the data bytes, possibly fewer than requested (EOF).
    pub fn data(unique: u64, data: &'a [u8]) -> Self {
        Reply::with_payload(unique, [data])
    }

    /// A LOOKUP, MKNOD, MKDIR, SYMLINK or LINK reply. A negative entry
    /// (`nodeid` 0, `entry_valid` > 0) lets the kernel cache the ENOENT.
    pub fn entry(unique: u64, entry: &'a fuse_entry_out) -> Self {
        Reply::arg(unique, entry)
    }

    /// A CREATE or TMPFILE reply: the new entry, then the open file.
    pub fn create(unique: u64, entry: &'a fuse_entry_out, open: &'a fuse_open_out) -> Self {
        Reply::with_payload(unique, [entry.as_bytes(), open.as_bytes()])
    }

    /// A READLINK reply: the target's bytes, without NUL (the kernel adds it).
    pub fn readlink(unique: u64, target: &'a [u8]) -> Self {
        Reply::data(unique, target)
    }

    /// A GETXATTR or LISTXATTR reply to a request of size 0: the value's (or
    /// list's) size, written into `out`; E2BIG past `u32::MAX`.
    pub fn xattr_size(unique: u64, size: usize, out: &'a mut fuse_getxattr_out) -> Self {
        let Ok(size) = u32::try_from(size) else {
            return Reply::error(unique, Errno::E2BIG);
        };
        *out = fuse_getxattr_out { size, padding: 0 };
        Reply::arg(unique, out)
    }

    /// A GETXATTR or LISTXATTR reply to a request of `requested` > 0 bytes:
    /// the value (a list is NUL-separated names), or ERANGE if it is longer.
    pub fn xattr_value(unique: u64, requested: u32, value: &'a [u8]) -> Self {
        match value.len() > requested as usize {
            true => Reply::error(unique, Errno::ERANGE),
            false => Reply::data(unique, value),
        }
    }

    /// `Ok(())` is an empty reply, `Err(errno)` an error reply.
    pub fn status(unique: u64, result: Result<(), Errno>) -> Self {
        result.map_or_else(
            |errno| Reply::error(unique, errno),
            |()| Reply::empty(unique),
        )
    }

    /// The computed header.
    pub fn header(&self) -> &fuse_out_header {
        &self.header
    }

    /// Total bytes on the wire, header included.
    pub fn len(&self) -> usize {
        self.header.len as usize
    }

    /// Never true: a reply always has its 16-byte header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Header bytes then payload slices, for writev(2) or an io_uring writev.
    pub fn io_slices(&self) -> IoSlices<'_> {
        let mut slices = [IoSlice::new(&[]); MAX_PAYLOAD_SLICES + 1];
        slices[0] = IoSlice::new(self.header.as_bytes());
        let mut count = 1;
        for part in self.payload.iter().filter(|p| !p.is_empty()) {
            slices[count] = IoSlice::new(part);
            count += 1;
        }
        IoSlices { slices, count }
    }
}

/// The iovecs of a [`Reply`]: derefs to `[IoSlice]`.
pub struct IoSlices<'a> {
    slices: [IoSlice<'a>; MAX_PAYLOAD_SLICES + 1],
    count: usize,
}

impl<'a> core::ops::Deref for IoSlices<'a> {
    type Target = [IoSlice<'a>];

    fn deref(&self) -> &[IoSlice<'a>] {
        &self.slices[..self.count]
    }
}

/// What became of a reply the kernel was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Sent {
    /// The kernel took the reply.
    Delivered,
    /// ENOENT: the request no longer exists (interrupted and answered, or
    /// aborted). Nothing to do; log it at debug level if at all.
    Gone,
}

/// Writes `reply` to `dev` with one writev(2); see the module contract.
///
/// Errors: ENODEV (unmounted; stop serving), EINVAL (malformed reply: a bug),
/// or a short write (reported as `ErrorKind::WriteZero`).
pub fn send(dev: &FuseDev, reply: &Reply<'_>) -> io::Result<Sent> {
    match dev.writev(&reply.io_slices()) {
        Ok(n) if n == reply.len() => Ok(Sent::Delivered),
        Ok(n) => Err(short_write(n, reply.len())),
        Err(err) => classify_write_error(err),
    }
}

/// Maps a failed reply write: ENOENT is [`Sent::Gone`], the rest stay errors.
pub fn classify_write_error(err: io::Error) -> io::Result<Sent> {
    match err.raw_os_error() {
        Some(libc::ENOENT) => Ok(Sent::Gone),
        _ => Err(err),
    }
}

fn short_write(written: usize, len: usize) -> io::Error {
    let msg = format!("short write of a FUSE reply: {written} of {len} bytes");
    io::Error::new(io::ErrorKind::WriteZero, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::fuse_write_out;

    #[test]
    fn header_counts_every_payload_byte() {
        let h = out_header(42, None, 4096);
        assert_eq!((h.len, h.error, h.unique), (4112, 0, 42));
        let h = out_header(43, Some(Errno::ENOSYS), 0);
        assert_eq!((h.len, h.error), (16, -libc::ENOSYS));
    }

    #[test]
    fn iovecs_are_header_then_payload_without_copies() {
        let (a, b) = ([1u8; 10], [2u8; 5]);
        let reply = Reply::with_payload(7, [&a[..], &[], &b[..]]);
        let iov = reply.io_slices();
        assert_eq!(iov.len(), 3);
        assert_eq!(iov[0].len(), 16);
        assert_eq!(iov[1].as_ptr(), a.as_ptr());
        assert_eq!(iov[2].as_ptr(), b.as_ptr());
        assert_eq!(reply.len(), 31);
    }

    #[test]
    fn error_and_struct_replies() {
        let reply = Reply::error(9, Errno::ENOENT);
        assert_eq!((reply.len(), reply.header().error), (16, -2));
        assert_eq!(reply.io_slices().len(), 1);
        let out = fuse_write_out {
            size: 4096,
            padding: 0,
        };
        let reply = Reply::arg(10, &out);
        assert_eq!(reply.len(), 24);
        assert_eq!(
            Reply::status(11, Err(Errno::EIO)).header().error,
            -libc::EIO
        );
    }

    #[test]
    fn entry_create_readlink_and_xattr_replies() {
        use zerocopy::FromZeros;
        let mut entry = fuse_entry_out::new_zeroed();
        entry.nodeid = 5;
        let open = fuse_open_out {
            fh: 9,
            open_flags: 0,
            backing_id: 0,
        };
        assert_eq!(Reply::entry(1, &entry).len(), 16 + 128);
        let create = Reply::create(2, &entry, &open);
        assert_eq!(create.len(), 16 + 128 + 16);
        let iov = create.io_slices();
        assert_eq!(
            (iov[1].len(), iov[2].as_ptr()),
            (128, open.as_bytes().as_ptr())
        );
        assert_eq!(Reply::readlink(3, b"../t").len(), 20);
        let mut out = fuse_getxattr_out::new_zeroed();
        let size = Reply::xattr_size(4, 300, &mut out);
        assert_eq!(
            (size.len(), &*size.io_slices()[1]),
            (24, &[44, 1, 0, 0, 0, 0, 0, 0][..])
        );
        assert_eq!(Reply::xattr_value(5, 3, b"xyz").len(), 19);
        let too_long = Reply::xattr_value(6, 2, b"xyz");
        assert_eq!(too_long.header().error, -libc::ERANGE);
    }

    #[test]
    fn enoent_on_write_means_gone() {
        let gone = classify_write_error(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(gone.unwrap(), Sent::Gone);
        let dead = classify_write_error(io::Error::from_raw_os_error(libc::ENODEV));
        assert_eq!(dead.unwrap_err().raw_os_error(), Some(libc::ENODEV));
    }
}
