//! The receive side of a connection: one buffer that a read of the socket fills with as
//! many bytes as the server has sent, so that one read yields several replies.
//!
//! The reader parses replies out of the buffer ([`BufWire`] is the parser's [`Wire`]); a
//! payload at least half the buffer's size is read straight into its destination instead
//! of through the buffer, with one `MSG_WAITALL` receive on the ring. Bytes left over when a reader gives up its role stay in the
//! buffer for the next reader: the buffer belongs to the connection, not to a reader.
//! [`complete`] tells whether the next whole message is already buffered, so a reader
//! whose own reply is done goes on parsing what costs no read of the socket.

use std::io;

use super::proto::{self, Header, NBD_CMD_READ};
use super::reply::{Table, Wire};
use super::stream::Stream;
use crate::Ctx;

/// Bytes of a connection's receive buffer.
pub const RX_LEN: usize = 256 << 10;

/// A connection's receive buffer: bytes `[start, end)` are received and not yet parsed.
#[derive(Default)]
pub struct RxBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RxBuf {
    /// An empty buffer of [`RX_LEN`] bytes.
    pub fn new() -> RxBuf {
        RxBuf {
            buf: vec![0; RX_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The received bytes not parsed yet.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Forgets the bytes not parsed yet (a new connection starts afresh).
    pub fn clear(&mut self) {
        (self.start, self.end) = (0, 0);
    }

    /// Copies up to `dst.len()` buffered bytes into `dst`; returns how many.
    fn take(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        n
    }
}

/// The socket read through a connection's [`RxBuf`], in the reader's context.
pub struct BufWire<'a> {
    pub rx: &'a mut RxBuf,
    pub stream: &'a Stream,
    pub cx: &'a Ctx<'a>,
}

impl Wire for BufWire<'_> {
    fn read_exact(&mut self, mut dst: &mut [u8]) -> io::Result<()> {
        let n = self.rx.take(dst);
        dst = &mut dst[n..];
        while !dst.is_empty() {
            // The buffer is empty here: a large payload skips it, in one receive.
            if dst.len() >= RX_LEN / 2 {
                return self.stream.read_exact(self.cx, dst);
            }
            let rx = &mut *self.rx;
            rx.end = self.stream.read_some(self.cx, &mut rx.buf)?;
            rx.start = 0;
            let n = rx.take(dst);
            dst = &mut dst[n..];
        }
        Ok(())
    }
}

/// Whether `pending` holds the whole of the next reply or chunk, by its header and, for a
/// simple reply to a read, the request it answers. A header the parser will refuse (bad
/// magic, unknown cookie) counts as complete: parsing it ends the connection at once,
/// without reading further.
pub fn complete(pending: &[u8], structured: bool, table: &mut dyn Table) -> bool {
    let Some(magic) = pending.get(..4) else {
        return false;
    };
    let Ok(len) = proto::header_len(magic.try_into().expect("4 bytes"), structured) else {
        return true;
    };
    let Some(head) = pending.get(..len) else {
        return false;
    };
    let need = match proto::decode_header(head) {
        Header::Simple { error, cookie } => match table.expect(cookie) {
            Some((e, _)) if error == 0 && e.kind == NBD_CMD_READ => len + e.len as usize,
            Some(_) => len,
            None => return true,
        },
        Header::Chunk { len: data, .. } => len + data as usize,
    };
    pending.len() >= need
}
