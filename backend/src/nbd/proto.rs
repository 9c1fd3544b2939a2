//! The NBD wire format: constants with the protocol's own names, the request encoder and
//! the decoders of reply headers. No I/O and no logic beyond checking what a header says;
//! `reply.rs` decides what a reply means for the request it answers.
//!
//! Compatible with the NBD protocol as NetworkBlockDevice/nbd `doc/proto.md` defines it,
//! fixed newstyle, simple and structured replies (not extended headers). Every number is
//! big-endian on the wire.
#![allow(missing_docs)]

use std::fmt;

// Handshake.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options and their replies.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// The metadata context of allocation status, which every server with block status has.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags (from the server, per export).
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Requests.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Bytes of the one block status descriptor (`length`, `status flags`) a
/// `NBD_CMD_BLOCK_STATUS` with `REQ_ONE` delivers to its caller.
pub const DESCRIPTOR_LEN: usize = 8;
/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;

// Replies.
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;
/// Bytes of a simple reply header.
pub const SIMPLE_LEN: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_LEN: usize = 20;
/// A structured reply's message may be at most this long (the spec's string limit).
pub const MAX_MESSAGE: u32 = 4096;

/// One request header: `C: magic, flags, type, cookie, offset, length`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// The 28 bytes on the wire.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// What breaks the protocol in a reply. Any of them ends the connection: after it, the
/// byte stream can no longer be trusted to be cut where the server meant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// Neither a simple nor a structured reply magic (or a structured one not negotiated).
    BadMagic(u32),
    /// A cookie no request in flight carries.
    UnknownCookie(u64),
    /// An error number the protocol does not define.
    UndefinedError(u32),
    /// A chunk type we do not know, or not valid for the request it answers.
    BadChunk { kind: u16, cookie: u64 },
    /// A chunk whose length disagrees with its type, or with the request (data past the
    /// range asked for, overlapping or out of order).
    BadLength { cookie: u64, len: u32 },
    /// A successful read reply that did not cover every byte asked for.
    ShortRead {
        cookie: u64,
        covered: u64,
        asked: u64,
    },
    /// A simple reply where the protocol demands a structured one (a read, once they are
    /// negotiated).
    SimpleRead(u64),
    /// A successful block status reply without the one descriptor asked for.
    NoStatus(u64),
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::BadMagic(m) => write!(f, "bad reply magic {m:#010x}"),
            ProtoError::UnknownCookie(c) => write!(f, "reply for unknown cookie {c:#x}"),
            ProtoError::UndefinedError(e) => write!(f, "undefined error value {e}"),
            ProtoError::BadChunk { kind, cookie } => {
                write!(f, "unexpected chunk type {kind:#x} for cookie {cookie:#x}")
            }
            ProtoError::BadLength { cookie, len } => {
                write!(f, "chunk of {len} bytes does not fit request {cookie:#x}")
            }
            ProtoError::ShortRead {
                cookie,
                covered,
                asked,
            } => write!(
                f,
                "read reply {cookie:#x} covers {covered} of {asked} bytes"
            ),
            ProtoError::SimpleRead(c) => {
                write!(f, "simple reply to read {c:#x} with structured replies on")
            }
            ProtoError::NoStatus(c) => write!(f, "block status reply {c:#x} without a status"),
        }
    }
}

/// A reply header: a simple reply, or one chunk of a structured reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// `S: magic, error, cookie`.
    Simple { error: u32, cookie: u64 },
    /// `S: magic, flags, type, cookie, length`, followed by `len` bytes.
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        len: u32,
    },
}

/// The magic at the start of a reply: it says how long the rest of the header is
/// ([`SIMPLE_LEN`] or [`CHUNK_LEN`] in all).
pub fn header_len(magic: [u8; 4], structured: bool) -> Result<usize, ProtoError> {
    match u32::from_be_bytes(magic) {
        NBD_SIMPLE_REPLY_MAGIC => Ok(SIMPLE_LEN),
        NBD_STRUCTURED_REPLY_MAGIC if structured => Ok(CHUNK_LEN),
        other => Err(ProtoError::BadMagic(other)),
    }
}

/// Decodes a whole header (magic included) of the length [`header_len`] gave.
pub fn decode_header(b: &[u8]) -> Header {
    let be32 = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let be64 = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let be16 = |i: usize| u16::from_be_bytes(b[i..i + 2].try_into().expect("2 bytes"));
    match b.len() {
        SIMPLE_LEN => Header::Simple {
            error: be32(4),
            cookie: be64(8),
        },
        _ => Header::Chunk {
            flags: be16(4),
            kind: be16(6),
            cookie: be64(8),
            len: be32(16),
        },
    }
}

/// The errno for an NBD error value; only the values the protocol defines are errors we
/// pass on (they share Linux's numbers), anything else is a protocol violation.
pub fn errno(error: u32) -> Result<i32, ProtoError> {
    match error as i32 {
        e @ (libc::EPERM
        | libc::EIO
        | libc::ENOMEM
        | libc::EINVAL
        | libc::ENOSPC
        | libc::EOVERFLOW
        | libc::EOPNOTSUPP
        | libc::ESHUTDOWN) => Ok(e),
        _ => Err(ProtoError::UndefinedError(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_bytes() {
        let req = Request {
            flags: NBD_CMD_FLAG_FUA,
            kind: NBD_CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 4096,
            len: 512,
        };
        #[rustfmt::skip]
        let golden = [
            0x25, 0x60, 0x95, 0x13, // NBD_REQUEST_MAGIC
            0x00, 0x01,             // flags: FUA
            0x00, 0x01,             // type: WRITE
            1, 2, 3, 4, 5, 6, 7, 8, // cookie
            0, 0, 0, 0, 0, 0, 0x10, 0, // offset 4096
            0, 0, 0x02, 0,          // length 512
        ];
        assert_eq!(req.encode(), golden);
    }

    #[test]
    fn reply_headers() {
        #[rustfmt::skip]
        let simple = [
            0x67, 0x44, 0x66, 0x98, // NBD_SIMPLE_REPLY_MAGIC
            0, 0, 0, 5,             // error: EIO
            0, 0, 0, 0, 0, 0, 0, 9, // cookie
        ];
        assert_eq!(header_len([0x67, 0x44, 0x66, 0x98], false), Ok(SIMPLE_LEN));
        assert_eq!(
            decode_header(&simple),
            Header::Simple {
                error: 5,
                cookie: 9
            }
        );
        #[rustfmt::skip]
        let chunk = [
            0x66, 0x8e, 0x33, 0xef, // NBD_STRUCTURED_REPLY_MAGIC
            0, 1,                   // flags: DONE
            0, 1,                   // type: OFFSET_DATA
            0, 0, 0, 0, 0, 0, 0, 7, // cookie
            0, 0, 0x10, 0x08,       // length: 8 (offset) + 4096
        ];
        assert_eq!(
            decode_header(&chunk),
            Header::Chunk {
                flags: 1,
                kind: 1,
                cookie: 7,
                len: 4104
            }
        );
        // A structured magic is a bad magic unless negotiated.
        let magic = [0x66, 0x8e, 0x33, 0xef];
        assert_eq!(header_len(magic, true), Ok(CHUNK_LEN));
        assert_eq!(
            header_len(magic, false),
            Err(ProtoError::BadMagic(NBD_STRUCTURED_REPLY_MAGIC))
        );
        assert_eq!(errno(28), Ok(libc::ENOSPC));
        assert_eq!(errno(2), Err(ProtoError::UndefinedError(2)));
    }
}
