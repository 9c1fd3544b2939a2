//! [`Errno`]: the error of a reply, guaranteed to be one the kernel accepts.
//!
//! The kernel rejects a reply whose `error` is positive or below -511 with
//! EINVAL, and the request it answers then hangs until the mount goes away. So
//! an error can only be built from a value in 1..=511, and everything else
//! (`io::Error`s without an OS code, or with a code out of range) becomes EIO.

use core::fmt;
use core::num::NonZeroI32;
use std::io;

/// A positive errno value in 1..=511, sent as `-errno` in `fuse_out_header`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(NonZeroI32);

/// Largest errno a reply may carry (the kernel checks `error > -512`).
const MAX_ERRNO: i32 = 511;

impl Errno {
    /// Operation not permitted.
    pub const EPERM: Errno = Errno::known(libc::EPERM);
    /// No such file or directory: the answer to every LOOKUP here.
    pub const ENOENT: Errno = Errno::known(libc::ENOENT);
    /// Interrupted.
    pub const EINTR: Errno = Errno::known(libc::EINTR);
    /// I/O error: the fallback for anything without a better code.
    pub const EIO: Errno = Errno::known(libc::EIO);
    /// Bad file handle.
    pub const EBADF: Errno = Errno::known(libc::EBADF);
    /// Try again.
    pub const EAGAIN: Errno = Errno::known(libc::EAGAIN);
    /// Permission denied.
    pub const EACCES: Errno = Errno::known(libc::EACCES);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno::known(libc::EINVAL);
    /// File too large.
    pub const EFBIG: Errno = Errno::known(libc::EFBIG);
    /// No space left on device.
    pub const ENOSPC: Errno = Errno::known(libc::ENOSPC);
    /// Read-only file system.
    pub const EROFS: Errno = Errno::known(libc::EROFS);
    /// No such device or address (lseek beyond the last data/hole).
    pub const ENXIO: Errno = Errno::known(libc::ENXIO);
    /// Function not implemented: the answer to unknown opcodes.
    pub const ENOSYS: Errno = Errno::known(libc::ENOSYS);
    /// Protocol error: the answer to an INIT with major < 7.
    pub const EPROTO: Errno = Errno::known(libc::EPROTO);
    /// Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno::known(libc::EOPNOTSUPP);
    /// Result too large: an xattr value longer than the caller's buffer.
    pub const ERANGE: Errno = Errno::known(libc::ERANGE);
    /// Argument list too long: an xattr size that does not fit the reply.
    pub const E2BIG: Errno = Errno::known(libc::E2BIG);
    /// No such attribute (ENODATA).
    pub const ENODATA: Errno = Errno::known(libc::ENODATA);
    /// File exists.
    pub const EEXIST: Errno = Errno::known(libc::EEXIST);
    /// Directory not empty.
    pub const ENOTEMPTY: Errno = Errno::known(libc::ENOTEMPTY);
    /// Not a directory.
    pub const ENOTDIR: Errno = Errno::known(libc::ENOTDIR);
    /// Is a directory.
    pub const EISDIR: Errno = Errno::known(libc::EISDIR);
    /// File name too long.
    pub const ENAMETOOLONG: Errno = Errno::known(libc::ENAMETOOLONG);

    /// Builds a constant from a libc code known to be in range.
    const fn known(code: i32) -> Errno {
        match Errno::new(code) {
            Some(errno) => errno,
            None => panic!("errno constant out of range"),
        }
    }

    /// `Some` if `code` is a positive errno in 1..=511.
    pub const fn new(code: i32) -> Option<Errno> {
        match NonZeroI32::new(code) {
            Some(nz) if code <= MAX_ERRNO && code > 0 => Some(Errno(nz)),
            _ => None,
        }
    }

    /// `code` if it is in range, EIO otherwise.
    pub const fn new_or_eio(code: i32) -> Errno {
        match Errno::new(code) {
            Some(errno) => errno,
            None => Errno::EIO,
        }
    }

    /// The positive errno value.
    pub const fn get(self) -> i32 {
        self.0.get()
    }

    /// The value for `fuse_out_header::error`: always in -511..=-1.
    pub const fn to_reply(self) -> i32 {
        -self.0.get()
    }
}

impl From<io::Error> for Errno {
    fn from(err: io::Error) -> Errno {
        Errno::from(&err)
    }
}

impl From<&io::Error> for Errno {
    fn from(err: &io::Error) -> Errno {
        err.raw_os_error().map_or(Errno::EIO, Errno::new_or_eio)
    }
}

impl From<Errno> for io::Error {
    fn from(errno: Errno) -> io::Error {
        io::Error::from_raw_os_error(errno.get())
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({})", self.get())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", io::Error::from(*self), self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_1_to_511_are_errnos() {
        assert_eq!(Errno::new(0), None);
        assert_eq!(Errno::new(-5), None);
        assert_eq!(Errno::new(512), None);
        assert_eq!(Errno::new(511).map(Errno::to_reply), Some(-511));
        assert_eq!(Errno::new(1).map(Errno::to_reply), Some(-1));
    }

    #[test]
    fn io_errors_map_to_their_code_or_eio() {
        let enospc = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(Errno::from(enospc), Errno::ENOSPC);
        assert_eq!(Errno::from(io::Error::from_raw_os_error(4000)), Errno::EIO);
        assert_eq!(Errno::from(io::Error::from_raw_os_error(-3)), Errno::EIO);
        assert_eq!(Errno::from(io::Error::other("no code")), Errno::EIO);
    }

    #[test]
    fn converts_back_to_io_error() {
        let err = io::Error::from(Errno::ENOSYS);
        assert_eq!(err.raw_os_error(), Some(libc::ENOSYS));
        assert!(Errno::ENOENT.to_string().contains("errno 2"));
    }
}
