//! The fixed-newstyle handshake, client side: done once per connection at open, with
//! blocking I/O (no loop serves yet).
//!
//! 1. `S: NBDMAGIC, IHAVEOPT, handshake flags`; a server without FIXED_NEWSTYLE (oldstyle,
//!    or plain newstyle) is refused. `C: client flags` (FIXED_NEWSTYLE, and NO_ZEROES
//!    where offered).
//! 2. With TLS: `NBD_OPT_STARTTLS`; after the server's ACK the TLS handshake runs on the
//!    same socket, and everything after it (the options below, then transmission) goes
//!    inside TLS. A server without TLS is refused rather than used in the clear.
//! 3. `NBD_OPT_STRUCTURED_REPLY`: an ACK turns structured replies on; an error reply
//!    (unsupported) leaves simple replies. With them, `NBD_OPT_SET_META_CONTEXT` asks for
//!    `base:allocation` (what is a hole, what reads as zeroes): the server answers the
//!    context's id, which block status replies carry, or nothing (no block status).
//! 4. `NBD_OPT_GO` with the export name and one information request,
//!    `NBD_INFO_BLOCK_SIZE`: the server answers `NBD_REP_INFO`s (export size and
//!    transmission flags; block sizes) then an ACK. Asking for block sizes commits us to
//!    honour them (see `mod.rs`). A server that does not know GO gets the old
//!    `NBD_OPT_EXPORT_NAME`, whose reply carries size and flags only.
//!
//! Every failure is one line saying what to do: the export is unknown, the server wants
//! TLS, the server is not an NBD server.

use std::io::{self, IoSlice};

use super::proto::*;
use super::stream::Stream;
use super::tls;
use crate::Ctx;

/// What the handshake settled for one export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    /// The export's size in bytes.
    pub size: u64,
    /// Transmission flags (`NBD_FLAG_*`).
    pub flags: u16,
    /// Minimum, preferred and maximum block size: requests are aligned to the first and at
    /// most the last long (payload).
    pub min_block: u32,
    /// The size below which the server does read-modify-write.
    pub pref_block: u32,
    /// The largest payload of one request.
    pub max_block: u32,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// The id of the `base:allocation` context, if the server has it (block status).
    pub allocation: Option<u32>,
}

/// The protocol's defaults where the server states no block sizes: 1 byte, 4 KiB, 32 MiB.
const DEFAULT_BLOCK: (u32, u32, u32) = (1, 4096, 32 << 20);

/// Negotiates `export` on a freshly connected `stream`, inside TLS if `tls` is given.
pub fn negotiate(stream: &mut Stream, export: &str, tls: Option<&tls::Client>) -> io::Result<Info> {
    let server_flags = greeting(stream)?;
    let mut client = NBD_FLAG_C_FIXED_NEWSTYLE;
    if server_flags & NBD_FLAG_NO_ZEROES != 0 {
        client |= NBD_FLAG_C_NO_ZEROES;
    }
    send(stream, &[&client.to_be_bytes()])?;
    if let Some(tls) = tls {
        start_tls(stream, tls)?;
    }
    let stream = &*stream;
    let structured = structured_replies(stream)?;
    let allocation = match structured {
        true => allocation_context(stream, export)?,
        false => None,
    };
    let mut info = match go(stream, export)? {
        Some(info) => Info { allocation, ..info },
        // A server that does not know GO does not know meta contexts either.
        None => export_name(stream, export, client & NBD_FLAG_C_NO_ZEROES != 0)?,
    };
    info.structured = structured;
    // The spec: "the client MUST ensure that offset and length are integer multiples of
    // any advertised minimum block size" -- also at the end. The bytes past the last
    // whole block cannot be reached; the export ends before them (QEMU refuses the export).
    let tail = info.size % u64::from(info.min_block);
    if tail != 0 {
        log::warn!(
            "nbd: the export's size {} is not a multiple of its minimum block {}: \
             its last {tail} bytes are left out",
            info.size,
            info.min_block
        );
        info.size -= tail;
    }
    Ok(info)
}

fn greeting(stream: &Stream) -> io::Result<u16> {
    let mut b = [0u8; 18];
    read(stream, &mut b)?;
    if u64::from_be_bytes(b[..8].try_into().expect("8")) != NBDMAGIC {
        return Err(refused(
            "the server did not greet with NBDMAGIC: is it an NBD server?",
        ));
    }
    if u64::from_be_bytes(b[8..16].try_into().expect("8")) != IHAVEOPT {
        return Err(refused(
            "the server speaks oldstyle NBD, which is not supported",
        ));
    }
    let flags = u16::from_be_bytes([b[16], b[17]]);
    if flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(refused("the server does not speak fixed-newstyle NBD"));
    }
    Ok(flags)
}

fn start_tls(stream: &mut Stream, tls: &tls::Client) -> io::Result<()> {
    send_option(stream, NBD_OPT_STARTTLS, &[])?;
    let (kind, data) = option_reply(stream, NBD_OPT_STARTTLS)?;
    match kind {
        NBD_REP_ACK if data.is_empty() => stream.start_tls(tls),
        k if k & NBD_REP_FLAG_ERROR != 0 => Err(refused(&format!(
            "the server does not offer TLS (STARTTLS refused: {}); mount without --tls-creds and nbds://",
            String::from_utf8_lossy(&data)
        ))),
        k => Err(refused(&format!("unexpected reply {k:#x} to STARTTLS"))),
    }
}

fn structured_replies(stream: &Stream) -> io::Result<bool> {
    send_option(stream, NBD_OPT_STRUCTURED_REPLY, &[])?;
    let (kind, data) = option_reply(stream, NBD_OPT_STRUCTURED_REPLY)?;
    match kind {
        NBD_REP_ACK if data.is_empty() => Ok(true),
        NBD_REP_ERR_TLS_REQD => Err(tls_required()),
        k if k & NBD_REP_FLAG_ERROR != 0 => Ok(false),
        k => Err(refused(&format!(
            "unexpected reply {k:#x} to STRUCTURED_REPLY"
        ))),
    }
}

/// `NBD_OPT_SET_META_CONTEXT` for `base:allocation` on `export`: the context's id, or
/// `None` if the server has no such context or does not know the option.
fn allocation_context(stream: &Stream, export: &str) -> io::Result<Option<u32>> {
    let name = export.as_bytes();
    let query = BASE_ALLOCATION.as_bytes();
    send_option(
        stream,
        NBD_OPT_SET_META_CONTEXT,
        &[
            &(name.len() as u32).to_be_bytes(),
            name,
            &1u32.to_be_bytes(),
            &(query.len() as u32).to_be_bytes(),
            query,
        ],
    )?;
    let mut id = None;
    loop {
        let (kind, data) = option_reply(stream, NBD_OPT_SET_META_CONTEXT)?;
        match kind {
            NBD_REP_META_CONTEXT if data.len() >= 4 && &data[4..] == query => {
                id = Some(u32::from_be_bytes(data[..4].try_into().expect("4")));
            }
            NBD_REP_META_CONTEXT => {
                return Err(refused("the server answered a meta context not asked for"))
            }
            NBD_REP_ACK => return Ok(id),
            NBD_REP_ERR_TLS_REQD => return Err(tls_required()),
            k if k & NBD_REP_FLAG_ERROR != 0 => return Ok(None),
            k => {
                return Err(refused(&format!(
                    "unexpected reply {k:#x} to SET_META_CONTEXT"
                )))
            }
        }
    }
}

/// `NBD_OPT_GO`; `None` if the server does not know it.
fn go(stream: &Stream, export: &str) -> io::Result<Option<Info>> {
    let name = export.as_bytes();
    let name_len = (name.len() as u32).to_be_bytes();
    let requests = [
        0u8,
        1,
        (NBD_INFO_BLOCK_SIZE >> 8) as u8,
        NBD_INFO_BLOCK_SIZE as u8,
    ];
    send_option(stream, NBD_OPT_GO, &[&name_len, name, &requests])?;
    let mut info = None;
    let mut blocks = DEFAULT_BLOCK;
    loop {
        let (kind, data) = option_reply(stream, NBD_OPT_GO)?;
        match kind {
            NBD_REP_INFO => match info_reply(&data)? {
                Some(InfoItem::Export(size, flags)) => info = Some((size, flags)),
                Some(InfoItem::Blocks(min, pref, max)) => blocks = (min, pref, max),
                None => {}
            },
            NBD_REP_ACK => break,
            NBD_REP_ERR_UNSUP => return Ok(None),
            k => return Err(go_error(k, export, &data)),
        }
    }
    let (size, flags) = info.ok_or_else(|| refused("the server sent no export information"))?;
    let (min_block, pref_block, max_block) = check_blocks(blocks)?;
    Ok(Some(Info {
        size,
        flags,
        min_block,
        pref_block,
        max_block,
        structured: false,
        allocation: None,
    }))
}

enum InfoItem {
    Export(u64, u16),
    Blocks(u32, u32, u32),
}

fn info_reply(data: &[u8]) -> io::Result<Option<InfoItem>> {
    let be32 = |i: usize| u32::from_be_bytes(data[i..i + 4].try_into().expect("4"));
    match (
        data.get(..2).map(|t| u16::from_be_bytes([t[0], t[1]])),
        data.len(),
    ) {
        (Some(NBD_INFO_EXPORT), 12) => Ok(Some(InfoItem::Export(
            u64::from_be_bytes(data[2..10].try_into().expect("8")),
            u16::from_be_bytes([data[10], data[11]]),
        ))),
        (Some(NBD_INFO_BLOCK_SIZE), 14) => Ok(Some(InfoItem::Blocks(be32(2), be32(6), be32(10)))),
        (Some(NBD_INFO_EXPORT | NBD_INFO_BLOCK_SIZE), _) | (None, _) => {
            Err(refused("malformed NBD_REP_INFO from the server"))
        }
        _ => Ok(None), // information we did not ask for: ignored, as the spec says
    }
}

/// Block sizes as the protocol requires them: powers of two, min <= 64 KiB, min <= pref,
/// and a max that holds at least one minimum block.
fn check_blocks((min, pref, max): (u32, u32, u32)) -> io::Result<(u32, u32, u32)> {
    let ok = min.is_power_of_two()
        && min <= 65536
        && pref.is_power_of_two()
        && pref >= min
        && max >= min;
    match ok {
        true => Ok((min, pref, max)),
        false => Err(refused(&format!(
            "the server's block sizes are invalid (min {min}, preferred {pref}, max {max})"
        ))),
    }
}

fn go_error(kind: u32, export: &str, data: &[u8]) -> io::Error {
    let msg = String::from_utf8_lossy(data);
    match kind {
        NBD_REP_ERR_UNKNOWN => refused(&format!(
            "the server has no export named {export:?} ({msg}); `nbdinfo --list` or `qemu-nbd -L` lists them"
        )),
        NBD_REP_ERR_TLS_REQD => tls_required(),
        NBD_REP_ERR_POLICY | NBD_REP_ERR_INVALID | NBD_REP_ERR_BLOCK_SIZE_REQD => {
            refused(&format!("the server refused export {export:?}: {msg}"))
        }
        k => refused(&format!("the server refused export {export:?} ({k:#x}): {msg}")),
    }
}

/// The old way in, for a server without GO: `NBD_OPT_EXPORT_NAME`, whose reply is the size
/// and flags (and 124 zero bytes unless NO_ZEROES), or a closed connection.
fn export_name(stream: &Stream, export: &str, no_zeroes: bool) -> io::Result<Info> {
    send_option(stream, NBD_OPT_EXPORT_NAME, &[export.as_bytes()])?;
    let mut b = [0u8; 10 + 124];
    let n = if no_zeroes { 10 } else { b.len() };
    read(stream, &mut b[..n])
        .map_err(|_| refused(&format!("the server has no export named {export:?}")))?;
    Ok(Info {
        size: u64::from_be_bytes(b[..8].try_into().expect("8")),
        flags: u16::from_be_bytes([b[8], b[9]]),
        min_block: DEFAULT_BLOCK.0,
        pref_block: DEFAULT_BLOCK.1,
        max_block: DEFAULT_BLOCK.2,
        structured: false,
        allocation: None,
    })
}

fn send_option(stream: &Stream, option: u32, data: &[&[u8]]) -> io::Result<()> {
    let len: usize = data.iter().map(|d| d.len()).sum();
    let head = [
        &IHAVEOPT.to_be_bytes()[..],
        &option.to_be_bytes(),
        &(len as u32).to_be_bytes(),
    ]
    .concat();
    let mut parts = vec![&head[..]];
    parts.extend_from_slice(data);
    send(stream, &parts)
}

/// One option reply: its type and data (at most 64 KiB, or the server is refused).
fn option_reply(stream: &Stream, option: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut b = [0u8; 20];
    read(stream, &mut b)?;
    let be32 = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4"));
    if u64::from_be_bytes(b[..8].try_into().expect("8")) != OPT_REPLY_MAGIC || be32(8) != option {
        return Err(refused("malformed option reply from the server"));
    }
    let len = be32(16) as usize;
    if len > 65536 {
        return Err(refused("option reply too long"));
    }
    let mut data = vec![0u8; len];
    read(stream, &mut data)?;
    Ok((be32(12), data))
}

fn send(stream: &Stream, parts: &[&[u8]]) -> io::Result<()> {
    let mut iov: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    stream
        .write_all(&Ctx::Blocking, &mut iov)
        .map_err(|e| closed(stream, e))
}

fn read(stream: &Stream, buf: &mut [u8]) -> io::Result<()> {
    stream
        .read_exact(&Ctx::Blocking, buf)
        .map_err(|e| closed(stream, e))
}

/// The server hung up (end of file, or a reset when it closed with our bytes unread).
fn closed(stream: &Stream, e: io::Error) -> io::Error {
    use io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | BrokenPipe => refused(&stream.why_closed()),
        _ => e,
    }
}

fn tls_required() -> io::Error {
    refused("the server requires TLS: give --tls-creds DIR")
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionRefused, why.to_owned())
}
