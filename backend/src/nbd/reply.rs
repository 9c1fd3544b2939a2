//! Reading replies: one simple reply or one structured chunk at a time, checked against the
//! request it answers, its payload put where that request wants it.
//!
//! This is the code a hostile server talks to, so it is written against two small traits
//! ([`Wire`] for the bytes, [`Table`] for the requests in flight) and fuzzed with byte
//! streams from memory (`backend/tests/nbd_fuzz.rs`). Its promises:
//! - a header with a bad magic, a cookie that no request in flight carries, an error value
//!   the protocol does not define, a chunk type that does not fit the request, a chunk that
//!   reaches outside the range asked for (a reply longer than asked), overlaps or goes
//!   backwards, or a successful read that leaves bytes uncovered is a [`ProtoError`]: the
//!   caller ends the connection, and no request completes with data it did not get;
//! - payload lands only inside the request's own range (checked before a byte is read);
//! - a block status reply carries exactly one descriptor (we ask with `REQ_ONE`) of the
//!   one context negotiated, else it is a [`ProtoError`] too;
//! - nothing panics and nothing is allocated: messages are read into a stack buffer.
//!
//! Chunks of one read must come in increasing offset order. The protocol allows any
//! order; QEMU and nbdkit send them in order, and this rule is what lets a sum of lengths
//! prove that every byte was covered, without a bitmap per request.

use std::io::{self, IoSliceMut};

use super::proto::{self, Header, ProtoError};
use super::proto::{NBD_CMD_BLOCK_STATUS, NBD_REPLY_TYPE_BLOCK_STATUS};
use super::proto::{NBD_CMD_READ, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE};
use super::proto::{NBD_REPLY_TYPE_ERROR, NBD_REPLY_TYPE_ERROR_OFFSET};
use super::proto::{NBD_REPLY_TYPE_OFFSET_DATA, NBD_REPLY_TYPE_OFFSET_HOLE};
use crate::iov;

/// A byte stream from the server.
pub trait Wire {
    /// Reads exactly `buf.len()` bytes.
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// Bytes already in hand (a block status descriptor) as a wire.
impl Wire for &[u8] {
    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        io::Read::read_exact(self, buf)
    }
}

/// Bytes of its reply a request's caller receives: a read's data, a block status
/// request's one descriptor, nothing for the others.
pub fn reply_len(expect: &Expect) -> usize {
    match expect.kind {
        NBD_CMD_READ => expect.len as usize,
        NBD_CMD_BLOCK_STATUS => proto::DESCRIPTOR_LEN,
        _ => 0,
    }
}

/// What a request in flight asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// `NBD_CMD_*`.
    pub kind: u16,
    /// The request's offset.
    pub offset: u64,
    /// The request's length.
    pub len: u32,
}

/// How far a structured reply has got, kept with its request between chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The first byte (relative to the request) a next data or hole chunk may start at.
    pub next: u64,
    /// Bytes covered by data and hole chunks so far.
    pub covered: u64,
    /// The first error an error chunk carried.
    pub error: Option<i32>,
}

/// The requests in flight, as the reader sees them.
pub trait Table {
    /// The request carrying `cookie` and its progress, if one is waiting for a reply.
    fn expect(&mut self, cookie: u64) -> Option<(Expect, Progress)>;
    /// The id the server gave `base:allocation` on this connection, if it has one.
    fn allocation_context(&mut self) -> Option<u32>;
    /// Reads `len` bytes of the request's data, for its bytes `[at, at + len)`, from
    /// `wire`. The range was checked to lie inside the request.
    fn data(&mut self, cookie: u64, at: usize, len: usize, wire: &mut dyn Wire) -> io::Result<()>;
    /// Its bytes `[at, at + len)` read as zeroes (checked as for `data`).
    fn hole(&mut self, cookie: u64, at: usize, len: usize);
    /// Keeps the progress of a reply that has more chunks to come.
    fn progress(&mut self, cookie: u64, progress: Progress);
    /// The reply is complete: `Ok`, or the errno to fail the request with.
    fn done(&mut self, cookie: u64, result: Result<(), i32>);
}

/// Why reading a reply stopped: the connection failed, or the server broke the protocol.
#[derive(Debug)]
pub enum ReadError {
    /// The socket failed or reached its end.
    Io(io::Error),
    /// The server sent something the protocol does not allow.
    Proto(ProtoError),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

impl From<ProtoError> for ReadError {
    fn from(e: ProtoError) -> Self {
        ReadError::Proto(e)
    }
}

/// Reads one simple reply or one structured chunk and applies it to its request.
pub fn read_one(
    wire: &mut dyn Wire,
    table: &mut dyn Table,
    structured: bool,
) -> Result<(), ReadError> {
    let mut head = [0u8; proto::CHUNK_LEN];
    wire.read_exact(&mut head[..4])?;
    let len = proto::header_len(head[..4].try_into().expect("4 bytes"), structured)?;
    wire.read_exact(&mut head[4..len])?;
    match proto::decode_header(&head[..len]) {
        Header::Simple { error, cookie } => simple(wire, table, structured, error, cookie),
        Header::Chunk {
            flags,
            kind,
            cookie,
            len,
        } => chunk(wire, table, flags, kind, cookie, len),
    }
}

fn simple(
    wire: &mut dyn Wire,
    table: &mut dyn Table,
    structured: bool,
    error: u32,
    cookie: u64,
) -> Result<(), ReadError> {
    let (expect, _) = table
        .expect(cookie)
        .ok_or(ProtoError::UnknownCookie(cookie))?;
    let is_read = expect.kind == NBD_CMD_READ;
    if is_read && structured {
        return Err(ProtoError::SimpleRead(cookie).into());
    }
    if error != 0 {
        // No payload follows an error, even for a read.
        table.done(cookie, Err(proto::errno(error)?));
        return Ok(());
    }
    if expect.kind == NBD_CMD_BLOCK_STATUS {
        return Err(ProtoError::NoStatus(cookie).into());
    }
    if is_read {
        table.data(cookie, 0, expect.len as usize, wire)?;
    }
    table.done(cookie, Ok(()));
    Ok(())
}

fn chunk(
    wire: &mut dyn Wire,
    table: &mut dyn Table,
    flags: u16,
    kind: u16,
    cookie: u64,
    len: u32,
) -> Result<(), ReadError> {
    let (expect, mut progress) = table
        .expect(cookie)
        .ok_or(ProtoError::UnknownCookie(cookie))?;
    let bad_kind = ProtoError::BadChunk { kind, cookie };
    let bad_len = ProtoError::BadLength { cookie, len };
    let is_read = expect.kind == NBD_CMD_READ;
    match kind {
        NBD_REPLY_TYPE_NONE if len != 0 => return Err(bad_len.into()),
        NBD_REPLY_TYPE_NONE if flags & NBD_REPLY_FLAG_DONE == 0 => return Err(bad_kind.into()),
        NBD_REPLY_TYPE_NONE => {}
        NBD_REPLY_TYPE_OFFSET_DATA if !is_read => return Err(bad_kind.into()),
        NBD_REPLY_TYPE_OFFSET_DATA => {
            let data = len.checked_sub(8).ok_or(bad_len.clone())?;
            let at = place(wire, &expect, &mut progress, u64::from(data), bad_len)?;
            table.data(cookie, at, data as usize, wire)?;
        }
        NBD_REPLY_TYPE_OFFSET_HOLE if !is_read => return Err(bad_kind.into()),
        NBD_REPLY_TYPE_OFFSET_HOLE if len != 12 => return Err(bad_len.into()),
        NBD_REPLY_TYPE_OFFSET_HOLE => {
            let offset = read_u64(wire)?;
            let mut size = [0u8; 4];
            wire.read_exact(&mut size)?;
            let size = u64::from(u32::from_be_bytes(size));
            let at = check_range(&expect, &mut progress, offset, size, bad_len)?;
            table.hole(cookie, at, size as usize);
        }
        NBD_REPLY_TYPE_BLOCK_STATUS if expect.kind != NBD_CMD_BLOCK_STATUS => {
            return Err(bad_kind.into())
        }
        // One context, one descriptor (`REQ_ONE`): one chunk of 4 + 8 bytes.
        NBD_REPLY_TYPE_BLOCK_STATUS if len != 4 + proto::DESCRIPTOR_LEN as u32 => {
            return Err(bad_len.into())
        }
        NBD_REPLY_TYPE_BLOCK_STATUS => {
            let mut b = [0u8; 4 + proto::DESCRIPTOR_LEN];
            wire.read_exact(&mut b)?;
            let context = u32::from_be_bytes(b[..4].try_into().expect("4 bytes"));
            let extent = u32::from_be_bytes(b[4..8].try_into().expect("4 bytes"));
            let repeated = progress.covered != 0;
            if repeated || table.allocation_context() != Some(context) || extent == 0 {
                return Err(bad_kind.into());
            }
            progress.covered = proto::DESCRIPTOR_LEN as u64;
            table.data(cookie, 0, proto::DESCRIPTOR_LEN, &mut &b[4..])?;
        }
        NBD_REPLY_TYPE_ERROR | NBD_REPLY_TYPE_ERROR_OFFSET => {
            let errno = error_chunk(wire, kind, len, bad_len)?;
            progress.error.get_or_insert(errno);
        }
        _ => return Err(bad_kind.into()),
    }
    if flags & NBD_REPLY_FLAG_DONE == 0 {
        table.progress(cookie, progress);
        return Ok(());
    }
    let result = match progress.error {
        Some(errno) => Err(errno),
        None if is_read && progress.covered != u64::from(expect.len) => {
            return Err(ProtoError::ShortRead {
                cookie,
                covered: progress.covered,
                asked: u64::from(expect.len),
            }
            .into());
        }
        None if expect.kind == NBD_CMD_BLOCK_STATUS && progress.covered == 0 => {
            return Err(ProtoError::NoStatus(cookie).into());
        }
        None => Ok(()),
    };
    table.done(cookie, result);
    Ok(())
}

/// Reads a data chunk's offset and checks where its `data` bytes go.
fn place(
    wire: &mut dyn Wire,
    expect: &Expect,
    progress: &mut Progress,
    data: u64,
    bad: ProtoError,
) -> Result<usize, ReadError> {
    let offset = read_u64(wire)?;
    check_range(expect, progress, offset, data, bad)
}

/// Where `[offset, offset + len)` starts inside the request, if it lies inside it, after
/// everything placed so far; advances `progress` past it.
fn check_range(
    expect: &Expect,
    progress: &mut Progress,
    offset: u64,
    len: u64,
    bad: ProtoError,
) -> Result<usize, ReadError> {
    let at = offset.checked_sub(expect.offset).ok_or(bad.clone())?;
    let end = at.checked_add(len).ok_or(bad.clone())?;
    if at < progress.next || end > u64::from(expect.len) {
        return Err(bad.into());
    }
    progress.next = end;
    progress.covered += len;
    Ok(at as usize)
}

/// Reads the rest of an error chunk: its errno, once the message (logged) is read past.
fn error_chunk(
    wire: &mut dyn Wire,
    kind: u16,
    len: u32,
    bad: ProtoError,
) -> Result<i32, ReadError> {
    let mut fixed = [0u8; 6];
    if len < 6 {
        return Err(bad.into());
    }
    wire.read_exact(&mut fixed)?;
    let error = u32::from_be_bytes(fixed[..4].try_into().expect("4 bytes"));
    let msg_len = u32::from(u16::from_be_bytes([fixed[4], fixed[5]]));
    let tail = if kind == NBD_REPLY_TYPE_ERROR_OFFSET {
        8
    } else {
        0
    };
    if msg_len > proto::MAX_MESSAGE || len != 6 + msg_len + tail {
        return Err(bad.into());
    }
    let mut msg = [0u8; proto::MAX_MESSAGE as usize];
    wire.read_exact(&mut msg[..msg_len as usize])?;
    wire.read_exact(&mut [0u8; 8][..tail as usize])?;
    let errno = proto::errno(error)?;
    let text = String::from_utf8_lossy(&msg[..msg_len as usize]);
    log::debug!("nbd: server error {errno}: {text}");
    Ok(errno)
}

fn read_u64(wire: &mut dyn Wire) -> io::Result<u64> {
    let mut b = [0u8; 8];
    wire.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Reads `len` bytes from `wire` into `bufs` from logical byte `at` on.
pub fn read_into(
    wire: &mut dyn Wire,
    bufs: &mut [IoSliceMut<'_>],
    at: usize,
    mut len: usize,
) -> io::Result<()> {
    let (mut idx, mut within) = iov::locate(bufs, at);
    while len > 0 {
        let Some(buf) = bufs.get_mut(idx) else {
            return Err(io::ErrorKind::InvalidInput.into()); // checked by the caller
        };
        let n = (buf.len() - within).min(len);
        wire.read_exact(&mut buf[within..within + n])?;
        (len, idx, within) = (len - n, idx + 1, 0);
    }
    Ok(())
}

/// Zeroes `len` bytes of `bufs` from logical byte `at` on.
pub fn zero_at(bufs: &mut [IoSliceMut<'_>], at: usize, mut len: usize) {
    let (first, mut within) = iov::locate(bufs, at);
    for buf in bufs[first..].iter_mut() {
        let n = (buf.len() - within).min(len);
        buf[within..within + n].fill(0);
        (len, within) = (len - n, 0);
    }
}
