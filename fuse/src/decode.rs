//! The request decoder: bytes read from /dev/fuse to a [`Request`].
//!
//! # Contract
//!
//! [`Request::decode`] never panics, never reads out of bounds and never
//! allocates, whatever bytes it is given: short, truncated, mutated or
//! misaligned input comes back as a [`DecodeError`]. Structs are viewed in place
//! with zerocopy's `ref_from_prefix`, which checks size and alignment.
//!
//! The input is the result of one read (or readv) of /dev/fuse, split in two:
//!
//! - `head`, the in-place part. It must be 8-byte aligned, and it must hold
//!   the header and the opcode's fixed arguments (a head of
//!   [`crate::init::RECOMMENDED_HEAD_SIZE`] holds those of every opcode).
//! - `tail`, the spill-over part. Only a WRITE payload or a SETXATTR value may
//!   continue there (see FUSE-NOTES "Large writes"); for any other known
//!   opcode a non-empty tail is a [`DecodeError::ShortRead`] of the head.
//!
//! `header.len` must equal `head.len() + tail.len()`: pass exactly the bytes
//! the read returned ([`crate::dev::split_read`] does that).
//!
//! Requests from kernels older than 7.9 (2008), whose GETATTR, READ and WRITE
//! arguments were shorter, are rejected as short reads; INIT alone accepts
//! every older size, so that negotiation can still refuse them politely.
//! MKNOD and CREATE are decoded with their 7.12+ layout (Linux 2.6.31, 2009):
//! a directory server should not accept an older kernel at INIT.
//!
//! # Names
//!
//! Names and symlink targets are borrowed as [`&CStr`](CStr), NUL included,
//! so that a server can hand them to openat(2), mkdirat(2), renameat2(2),
//! setxattr(2)... without copying; `to_bytes()` gives them without the NUL.
//! The kernel sends names back to back after the opcode's struct, each with
//! its NUL (two for RENAME, RENAME2 and SYMLINK: first the entry's name, then
//! the new name or the link target), and never an empty one. So the decoder
//! rejects a name without NUL ([`DecodeError::MissingNul`]), an empty name
//! ([`DecodeError::EmptyName`]) and bytes after the last name
//! ([`DecodeError::TrailingBytes`]). Fixed-size arguments stay lenient about
//! trailing bytes, as before: a newer kernel may send a longer struct.
//!
//! # What INIT changed
//!
//! One layout depends on the negotiation, not on the request: SETXATTR's
//! struct is 16 bytes if FUSE_SETXATTR_EXT was granted, else 8, and nothing in
//! the request says which. [`Request::decode_with`] takes the [`Features`] of
//! the session (from the granted flags); [`Request::decode`] assumes none of
//! them, which is right for a server that never asks for SETXATTR_EXT.

use crate::abi::*;
use crate::request::{Operation, Request, WriteData};
use core::fmt;
use core::mem::size_of;
use std::ffi::CStr;
use zerocopy::{ConvertError, FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Why a buffer is not a valid request. Each message says what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The head ends `got` bytes in, but `need` bytes were needed there.
    ShortRead {
        /// Bytes needed from the start of the request.
        need: usize,
        /// Bytes available in the head.
        got: usize,
    },
    /// `fuse_in_header::len` differs from the bytes supplied.
    LengthMismatch {
        /// Length the header claims.
        header: u32,
        /// Bytes supplied (head + tail).
        got: usize,
    },
    /// A WRITE's or SETXATTR's `size` differs from the payload that follows it.
    WriteSizeMismatch {
        /// `fuse_write_in::size` or `fuse_setxattr_in::size`.
        size: u32,
        /// Payload bytes present.
        got: usize,
    },
    /// The head is not aligned for the kernel structs (8 bytes).
    Unaligned,
    /// A name has no NUL terminator.
    MissingNul,
    /// A name is empty, which the kernel never sends.
    EmptyName,
    /// Bytes follow the last name of a request.
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::ShortRead { need, got } => write!(
                f,
                "request truncated: needed {need} bytes in the in-place head, got {got}; \
                 size the head with init::RECOMMENDED_HEAD_SIZE"
            ),
            DecodeError::LengthMismatch { header, got } => write!(
                f,
                "request header says {header} bytes but {got} were supplied; \
                 pass exactly the bytes read(2) returned"
            ),
            DecodeError::WriteSizeMismatch { size, got } => {
                write!(f, "WRITE or SETXATTR of {size} bytes carries {got} bytes of data")
            }
            DecodeError::Unaligned => f.write_str(
                "request buffer is not 8-byte aligned; allocate it as u64s or with an aligned layout",
            ),
            DecodeError::MissingNul => f.write_str("name in request is not NUL-terminated"),
            DecodeError::EmptyName => f.write_str("empty name in request"),
            DecodeError::TrailingBytes { extra } => {
                write!(f, "{extra} bytes after the last name of the request")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// The negotiated flags that change how requests are laid out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// FUSE_SETXATTR_EXT: SETXATTR carries the 16-byte `fuse_setxattr_in`.
    pub setxattr_ext: bool,
}

impl Features {
    /// The features implied by the INIT flags granted ([`crate::init::Negotiated::flags`]).
    pub const fn from_flags(granted: u64) -> Features {
        Features {
            setxattr_ext: granted & FUSE_SETXATTR_EXT != 0,
        }
    }
}

/// The layout of every request on names (LOOKUP and READLINK included),
/// listings, xattrs, access, locks, copy_file_range, poll and syncfs: opcode,
/// size of the struct that starts its arguments, and how many NUL-terminated
/// names follow it. SETXATTR's size is that of its 8-byte layout (16 with
/// FUSE_SETXATTR_EXT), and `size` bytes of value follow its name. For fuzzers
/// and tests that build requests; the decoder is the opcode match below.
pub const DIR_REQUEST_LAYOUTS: [(u32, usize, usize); 29] = [
    (FUSE_LOOKUP, 0, 1),
    (FUSE_READLINK, 0, 0),
    (FUSE_SYMLINK, 0, 2),
    (FUSE_MKNOD, 16, 1),
    (FUSE_MKDIR, 8, 1),
    (FUSE_UNLINK, 0, 1),
    (FUSE_RMDIR, 0, 1),
    (FUSE_RENAME, 8, 2),
    (FUSE_RENAME2, 16, 2),
    (FUSE_LINK, 8, 1),
    (FUSE_CREATE, 16, 1),
    (FUSE_TMPFILE, 16, 1),
    (FUSE_OPENDIR, 8, 0),
    (FUSE_READDIR, 40, 0),
    (FUSE_READDIRPLUS, 40, 0),
    (FUSE_RELEASEDIR, 24, 0),
    (FUSE_FSYNCDIR, 16, 0),
    (FUSE_SETXATTR, FUSE_COMPAT_SETXATTR_IN_SIZE, 1),
    (FUSE_GETXATTR, 8, 1),
    (FUSE_LISTXATTR, 8, 0),
    (FUSE_REMOVEXATTR, 0, 1),
    (FUSE_ACCESS, 8, 0),
    (FUSE_GETLK, 48, 0),
    (FUSE_SETLK, 48, 0),
    (FUSE_SETLKW, 48, 0),
    (FUSE_COPY_FILE_RANGE, 56, 0),
    (FUSE_COPY_FILE_RANGE_64, 56, 0),
    (FUSE_POLL, 24, 0),
    (FUSE_SYNCFS, 8, 0),
];

/// Views the header at the start of `head`, if it is there and aligned.
///
/// Lets a server reply EIO to a request that [`Request::decode`] rejected.
pub fn header_of(head: &[u8]) -> Option<&fuse_in_header> {
    fuse_in_header::ref_from_prefix(head).ok().map(|(h, _)| h)
}

/// A cursor over the head that hands out references to kernel structs.
struct Args<'a> {
    bytes: &'a [u8],
    /// Offset of `bytes` from the start of the request, for error reports.
    offset: usize,
}

impl<'a> Args<'a> {
    fn short(&self, need: usize) -> DecodeError {
        DecodeError::ShortRead {
            need: self.offset.saturating_add(need),
            got: self.offset + self.bytes.len(),
        }
    }

    fn advance(&mut self, n: usize, rest: &'a [u8]) {
        self.offset += n;
        self.bytes = rest;
    }

    /// The next `T`, viewed in place.
    fn fetch<T: FromBytes + KnownLayout + Immutable>(&mut self) -> Result<&'a T, DecodeError> {
        match T::ref_from_prefix(self.bytes) {
            Ok((arg, rest)) => {
                self.advance(size_of::<T>(), rest);
                Ok(arg)
            }
            Err(ConvertError::Alignment(_)) => Err(DecodeError::Unaligned),
            Err(ConvertError::Size(_)) => Err(self.short(size_of::<T>())),
            Err(ConvertError::Validity(never)) => match never {},
        }
    }

    /// The next `count` `T`s, viewed in place.
    fn fetch_slice<T: FromBytes + Immutable>(
        &mut self,
        count: u32,
    ) -> Result<&'a [T], DecodeError> {
        let count = count as usize;
        match <[T]>::ref_from_prefix_with_elems(self.bytes, count) {
            Ok((items, rest)) => {
                self.advance(size_of::<T>().saturating_mul(count), rest);
                Ok(items)
            }
            Err(ConvertError::Alignment(_)) => Err(DecodeError::Unaligned),
            Err(ConvertError::Size(_)) => Err(self.short(size_of::<T>().saturating_mul(count))),
            Err(ConvertError::Validity(never)) => match never {},
        }
    }

    /// The INIT argument, copied and zero-extended: kernels before 7.36 send
    /// 16 bytes, before 7.6 only 8.
    fn fetch_init(&mut self) -> Result<fuse_init_in, DecodeError> {
        let mut arg = fuse_init_in::new_zeroed();
        let n = self.bytes.len().min(size_of::<fuse_init_in>());
        if n < 8 {
            return Err(self.short(8));
        }
        let (init, rest) = self.bytes.split_at(n);
        arg.as_mut_bytes()[..n].copy_from_slice(init);
        self.advance(n, rest);
        Ok(arg)
    }

    /// A NUL-terminated, non-empty name, NUL included.
    fn fetch_name(&mut self) -> Result<&'a CStr, DecodeError> {
        let name = CStr::from_bytes_until_nul(self.bytes).map_err(|_| DecodeError::MissingNul)?;
        let len = name.count_bytes() + 1;
        if len == 1 {
            return Err(DecodeError::EmptyName);
        }
        let rest = &self.bytes[len..];
        self.advance(len, rest);
        Ok(name)
    }

    /// A name that must end the request.
    fn last_name(&mut self) -> Result<&'a CStr, DecodeError> {
        let name = self.fetch_name()?;
        match self.bytes.len() {
            0 => Ok(name),
            extra => Err(DecodeError::TrailingBytes { extra }),
        }
    }

    /// SETXATTR's argument, zero-extended from the 8-byte layout without
    /// FUSE_SETXATTR_EXT.
    fn fetch_setxattr(&mut self, features: Features) -> Result<fuse_setxattr_in, DecodeError> {
        let n = match features.setxattr_ext {
            true => size_of::<fuse_setxattr_in>(),
            false => FUSE_COMPAT_SETXATTR_IN_SIZE,
        };
        let Some((bytes, rest)) = self.bytes.split_at_checked(n) else {
            return Err(self.short(n));
        };
        let mut arg = fuse_setxattr_in::new_zeroed();
        arg.as_mut_bytes()[..n].copy_from_slice(bytes);
        self.advance(n, rest);
        Ok(arg)
    }
}

impl<'a> Request<'a> {
    /// Decodes one request of a session without [`Features`]; see the
    /// [module docs](self) for `head` and `tail`.
    pub fn decode(head: &'a [u8], tail: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        Request::decode_with(head, tail, Features::default())
    }

    /// Decodes one request of a session that negotiated `features`.
    pub fn decode_with(
        head: &'a [u8],
        tail: &'a [u8],
        features: Features,
    ) -> Result<Request<'a>, DecodeError> {
        let mut args = Args {
            bytes: head,
            offset: 0,
        };
        let h: &fuse_in_header = args.fetch()?;
        let got = head.len().saturating_add(tail.len());
        if h.len as usize != got {
            return Err(DecodeError::LengthMismatch { header: h.len, got });
        }
        let tail = strip_extensions(&mut args, tail, h.total_extlen)?;
        let op = decode_operation(h.opcode, args, tail, features)?;
        Ok(Request::from_parts(h, op))
    }
}

/// Drops the `total_extlen * 8` bytes of extensions that end the request.
fn strip_extensions<'a>(
    args: &mut Args<'a>,
    tail: &'a [u8],
    extlen: u16,
) -> Result<&'a [u8], DecodeError> {
    let ext = usize::from(extlen) * 8;
    if ext <= tail.len() {
        return Ok(&tail[..tail.len() - ext]);
    }
    let from_head = ext - tail.len();
    let keep = args
        .bytes
        .len()
        .checked_sub(from_head)
        .ok_or(args.short(from_head))?;
    args.bytes = &args.bytes[..keep];
    Ok(&[])
}

/// The `size` bytes that end the request, in the head and the tail.
fn payload<'a>(args: &Args<'a>, tail: &'a [u8], size: u32) -> Result<WriteData<'a>, DecodeError> {
    let data = WriteData::new(args.bytes, tail);
    match data.len() == size as usize {
        true => Ok(data),
        false => Err(DecodeError::WriteSizeMismatch {
            size,
            got: data.len(),
        }),
    }
}

/// Decodes the arguments after the header. Only WRITE and SETXATTR may use the tail.
fn decode_operation<'a>(
    opcode: u32,
    mut args: Args<'a>,
    tail: &'a [u8],
    features: Features,
) -> Result<Operation<'a>, DecodeError> {
    let end = args.offset + args.bytes.len();
    // A request that belongs in the head spilled over: the head is too small.
    let head_too_short = DecodeError::ShortRead {
        need: end + tail.len(),
        got: end,
    };
    let spilled = |err| match tail.is_empty() {
        true => err,
        false => head_too_short,
    };
    match opcode {
        FUSE_WRITE => {
            let arg: &fuse_write_in = args.fetch()?;
            let data = payload(&args, tail, arg.size)?;
            Ok(Operation::Write { arg, data })
        }
        FUSE_SETXATTR => {
            let arg = args.fetch_setxattr(features).map_err(spilled)?;
            let name = args.fetch_name().map_err(spilled)?;
            let value = payload(&args, tail, arg.size)?;
            Ok(Operation::Setxattr { arg, name, value })
        }
        _ => match decode_in_head(opcode, &mut args) {
            Ok(op @ Operation::Unknown { .. }) => Ok(op),
            Ok(_) if !tail.is_empty() => Err(head_too_short),
            result => result.map_err(spilled),
        },
    }
}

/// The flat opcode match for every operation whose arguments live in the head.
fn decode_in_head<'a>(opcode: u32, args: &mut Args<'a>) -> Result<Operation<'a>, DecodeError> {
    Ok(match opcode {
        FUSE_INIT => Operation::Init {
            arg: args.fetch_init()?,
        },
        FUSE_GETATTR => Operation::Getattr { arg: args.fetch()? },
        FUSE_SETATTR => Operation::Setattr { arg: args.fetch()? },
        FUSE_OPEN => Operation::Open { arg: args.fetch()? },
        FUSE_RELEASE => Operation::Release { arg: args.fetch()? },
        FUSE_FLUSH => Operation::Flush { arg: args.fetch()? },
        FUSE_FSYNC => Operation::Fsync { arg: args.fetch()? },
        FUSE_READ => Operation::Read { arg: args.fetch()? },
        FUSE_FALLOCATE => Operation::Fallocate { arg: args.fetch()? },
        FUSE_LSEEK => Operation::Lseek { arg: args.fetch()? },
        FUSE_STATFS => Operation::Statfs,
        FUSE_LOOKUP => Operation::Lookup {
            name: args.last_name()?,
        },
        FUSE_READLINK => Operation::Readlink,
        FUSE_SYMLINK => Operation::Symlink {
            name: args.fetch_name()?,
            target: args.last_name()?,
        },
        FUSE_MKNOD => Operation::Mknod {
            arg: args.fetch()?,
            name: args.last_name()?,
        },
        FUSE_MKDIR => Operation::Mkdir {
            arg: args.fetch()?,
            name: args.last_name()?,
        },
        FUSE_UNLINK => Operation::Unlink {
            name: args.last_name()?,
        },
        FUSE_RMDIR => Operation::Rmdir {
            name: args.last_name()?,
        },
        FUSE_RENAME => Operation::Rename {
            arg: args.fetch()?,
            name: args.fetch_name()?,
            newname: args.last_name()?,
        },
        FUSE_RENAME2 => Operation::Rename2 {
            arg: args.fetch()?,
            name: args.fetch_name()?,
            newname: args.last_name()?,
        },
        FUSE_LINK => Operation::Link {
            arg: args.fetch()?,
            newname: args.last_name()?,
        },
        FUSE_CREATE => Operation::Create {
            arg: args.fetch()?,
            name: args.last_name()?,
        },
        FUSE_TMPFILE => Operation::Tmpfile {
            arg: args.fetch()?,
            name: args.last_name()?,
        },
        FUSE_OPENDIR => Operation::Opendir { arg: args.fetch()? },
        FUSE_READDIR => Operation::Readdir { arg: args.fetch()? },
        FUSE_READDIRPLUS => Operation::Readdirplus { arg: args.fetch()? },
        FUSE_RELEASEDIR => Operation::Releasedir { arg: args.fetch()? },
        FUSE_FSYNCDIR => Operation::Fsyncdir { arg: args.fetch()? },
        FUSE_GETXATTR => Operation::Getxattr {
            arg: args.fetch()?,
            name: args.last_name()?,
        },
        FUSE_LISTXATTR => Operation::Listxattr { arg: args.fetch()? },
        FUSE_REMOVEXATTR => Operation::Removexattr {
            name: args.last_name()?,
        },
        FUSE_ACCESS => Operation::Access { arg: args.fetch()? },
        FUSE_GETLK => Operation::Getlk { arg: args.fetch()? },
        FUSE_SETLK => Operation::Setlk { arg: args.fetch()? },
        FUSE_SETLKW => Operation::Setlkw { arg: args.fetch()? },
        FUSE_COPY_FILE_RANGE => Operation::CopyFileRange { arg: args.fetch()? },
        FUSE_COPY_FILE_RANGE_64 => Operation::CopyFileRange64 { arg: args.fetch()? },
        FUSE_POLL => Operation::Poll { arg: args.fetch()? },
        FUSE_SYNCFS => Operation::Syncfs { arg: args.fetch()? },
        FUSE_INTERRUPT => Operation::Interrupt { arg: args.fetch()? },
        FUSE_STATX => Operation::Statx { arg: args.fetch()? },
        FUSE_FORGET => Operation::Forget { arg: args.fetch()? },
        FUSE_BATCH_FORGET => {
            let arg: &fuse_batch_forget_in = args.fetch()?;
            Operation::BatchForget {
                arg,
                nodes: args.fetch_slice(arg.count)?,
            }
        }
        FUSE_DESTROY => Operation::Destroy,
        opcode => Operation::Unknown { opcode },
    })
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "decode_dir_tests.rs"]
mod dir_tests;

#[cfg(test)]
#[path = "decode_fuzz.rs"]
mod fuzz;
