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
//! - `tail`, the spill-over part. Only a WRITE payload may continue there (see
//!   FUSE-NOTES "Large writes"); for any other known opcode a non-empty tail
//!   is a [`DecodeError::ShortRead`] of the head.
//!
//! `header.len` must equal `head.len() + tail.len()`: pass exactly the bytes
//! the read returned ([`crate::dev::split_read`] does that).
//!
//! Requests from kernels older than 7.9 (2008), whose GETATTR, READ and WRITE
//! arguments were shorter, are rejected as short reads; INIT alone accepts
//! every older size, so that negotiation can still refuse them politely.

use crate::abi::*;
use crate::request::{Operation, Request, WriteData};
use core::fmt;
use core::mem::size_of;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
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
    /// A WRITE's `size` differs from the payload that follows it.
    WriteSizeMismatch {
        /// `fuse_write_in::size`.
        size: u32,
        /// Payload bytes present.
        got: usize,
    },
    /// The head is not aligned for the kernel structs (8 bytes).
    Unaligned,
    /// A name (LOOKUP) has no NUL terminator.
    MissingNul,
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
                write!(f, "WRITE of {size} bytes carries {got} bytes of data")
            }
            DecodeError::Unaligned => f.write_str(
                "request buffer is not 8-byte aligned; allocate it as u64s or with an aligned layout",
            ),
            DecodeError::MissingNul => f.write_str("name in request is not NUL-terminated"),
        }
    }
}

impl std::error::Error for DecodeError {}

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

    /// A NUL-terminated name, without its NUL.
    fn fetch_name(&mut self) -> Result<&'a OsStr, DecodeError> {
        let len = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul)?;
        let (name, rest) = self.bytes.split_at(len);
        self.advance(len + 1, &rest[1..]);
        Ok(OsStr::from_bytes(name))
    }
}

impl<'a> Request<'a> {
    /// Decodes one request; see the [module docs](self) for `head` and `tail`.
    pub fn decode(head: &'a [u8], tail: &'a [u8]) -> Result<Request<'a>, DecodeError> {
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
        let op = decode_operation(h.opcode, args, tail)?;
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

/// Decodes the arguments after the header. Only WRITE may use the tail.
fn decode_operation<'a>(
    opcode: u32,
    mut args: Args<'a>,
    tail: &'a [u8],
) -> Result<Operation<'a>, DecodeError> {
    if opcode == FUSE_WRITE {
        let arg: &fuse_write_in = args.fetch()?;
        let data = WriteData::new(args.bytes, tail);
        if data.len() != arg.size as usize {
            return Err(DecodeError::WriteSizeMismatch {
                size: arg.size,
                got: data.len(),
            });
        }
        return Ok(Operation::Write { arg, data });
    }
    let end = args.offset + args.bytes.len();
    let op = decode_in_head(opcode, &mut args)?;
    match op {
        Operation::Unknown { .. } => Ok(op),
        _ if tail.is_empty() => Ok(op),
        _ => Err(DecodeError::ShortRead {
            need: end + tail.len(),
            got: end,
        }),
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
            name: args.fetch_name()?,
        },
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
#[path = "decode_fuzz.rs"]
mod fuzz;
