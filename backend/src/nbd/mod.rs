//! The NBD client backend: the exported disk is an export of an NBD server (qemu-nbd,
//! nbdkit, qemu-storage-daemon, nbd-server), as QEMU's `driver=nbd` reaches it.
//!
//! `nbd://HOST[:PORT]/EXPORT` or `nbd+unix:///EXPORT?socket=PATH` (`uri`) is connected and
//! negotiated at open (`handshake`: fixed newstyle, structured replies where offered,
//! `NBD_OPT_GO` with block sizes). Then every request is one or more NBD commands on a
//! connection (`conn`, which also says how replies reach the requests waiting for them;
//! made again when lost in `redial`), the wire format in `proto`, replies checked in
//! `reply`, the socket in `stream`, TLS (`--tls-creds`, `nbds://`) in `tls`.
//!
//! # What each operation sends
//! - read, write: `NBD_CMD_READ`/`WRITE`, split at the server's maximum payload. The size
//!   is the server's and fixed: a write past the end fails with `ENOSPC`, a read there is
//!   short; resize fails: growing with `ENOSPC` (no space past the end), shrinking with
//!   `EOPNOTSUPP`.
//! - flush: `NBD_CMD_FLUSH` where the server offers it (else nothing to do: it has no
//!   cache to flush). With several connections (`CAN_MULTI_CONN`), a flush on one covers
//!   the writes completed on all, as the flag promises.
//! - write_zeroes: `NBD_CMD_WRITE_ZEROES`, with `NO_HOLE` when the caller must not unmap;
//!   without the command, zeroes are written. `FAST_ZERO` is never asked: the trait has no
//!   caller that would rather fail than be slow.
//! - discard: `NBD_CMD_WRITE_ZEROES` that may unmap, not `NBD_CMD_TRIM`: the trait
//!   promises that discarded bytes read as zeroes, and after a TRIM the protocol promises
//!   nothing about them. Without WRITE_ZEROES, `EOPNOTSUPP`.
//! - No `FUA`: `--direct` means "no page cache of ours", which a client with no cache
//!   already is; O_DIRECT does not make a write durable, flush does.
//! - block_status (`SEEK_DATA`/`SEEK_HOLE`): `NBD_CMD_BLOCK_STATUS` with `REQ_ONE` in the
//!   `base:allocation` context, where the server has it (else all data, as when it
//!   refuses a request): a hole where the server says the range is both unallocated and
//!   reads as zeroes, data otherwise. Allocated bytes: the size.
//!
//! # Block sizes
//! Commands respect the server's block sizes: split at its maximum payload, and aligned
//! to its minimum block. Where that minimum is more than a byte (nbdkit's blocksize-policy
//! filter), a request it does not divide is made whole blocks (`align`): a read through a
//! bounce buffer, a write as a read-modify-write holding its blocks against the other
//! writes. With a minimum of 1 (qemu-nbd, nbdkit's plugins) every request goes as it
//! is.
//!
//! # Connections
//! With `CAN_MULTI_CONN`, `NbdOptions::connections` connections are opened and a thread
//! (an event loop, or a worker) uses connection `i % n`, `i` counting threads in the
//! order they first reach the backend; without it, one connection serves every thread.

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod align;
mod conn;
mod handshake;
#[doc(hidden)]
pub mod proto;
#[doc(hidden)]
pub mod reply;
mod rx;
mod stream;
mod tls;
mod uri;

pub use handshake::Info;
pub use tls::TlsOptions;
pub use uri::{is_nbd, Address, Uri, DEFAULT_PORT};

use self::align::{Align, Blocks};
use self::conn::{Cmd, Conn, Redial};
use self::proto::*;
use crate::iov;
use crate::{checked_end, BlockBackend, Ctx, Extent, OpenOptions};

/// How to reach an NBD export, beyond [`OpenOptions`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdOptions {
    /// Connections to open where the server advertises `CAN_MULTI_CONN` (one otherwise).
    pub connections: usize,
    /// Requests in flight on one connection at most; more wait for a free slot.
    pub max_in_flight: usize,
    /// How long requests wait while a lost connection is made again (QEMU's
    /// `reconnect-delay`), counted from the loss; zero: each request gets one try at a new
    /// connection, then fails with `EIO` (see `redial.rs`).
    pub reconnect_delay: Duration,
    /// TLS credentials (`--tls-creds`): TLS is used with them, also for an `nbd://` URI,
    /// as QEMU's `tls-creds` does; `nbds://` requires them.
    pub tls: Option<TlsOptions>,
    /// How long the first connection is tried again while the server is not there yet
    /// (refused, or no socket file), as QEMU's `open-timer`; zero: one attempt.
    pub open_timer: Duration,
}

impl Default for NbdOptions {
    fn default() -> Self {
        NbdOptions {
            connections: 1,
            max_in_flight: 128,
            reconnect_delay: Duration::ZERO,
            tls: None,
            open_timer: Duration::ZERO,
        }
    }
}

/// An export on an NBD server.
pub struct NbdBackend {
    uri: Uri,
    info: Info,
    writable: bool,
    conns: Box<[Conn]>,
    /// The largest payload of one command: the server's maximum, aligned to its minimum.
    max_payload: u32,
    /// Requests made whole blocks, where the minimum block is more than a byte.
    align: Option<Align>,
}

/// Opens `spec` (an NBD URI) as `opts` say; errors are one line naming the URI.
pub fn open(spec: &str, opts: &OpenOptions, nbd: &NbdOptions) -> io::Result<NbdBackend> {
    let mut uri = uri::parse(spec).map_err(|e| invalid(spec, &e.to_string()))?;
    let tls = match (&nbd.tls, uri.tls) {
        (Some(tls), _) => {
            let host = match &uri.address {
                Address::Tcp { host, .. } => Some(host.as_str()),
                Address::Unix(_) => None,
            };
            uri.tls = true;
            Some(tls::Client::new(tls, host).map_err(|e| invalid(spec, &e.to_string()))?)
        }
        (None, true) => return Err(invalid(spec, "nbds:// needs --tls-creds DIR")),
        (None, false) => None,
    };
    if opts.snapshot.is_some() && opts.format != crate::Format::Qcow2 {
        return Err(invalid(spec, "a raw NBD export has no snapshots"));
    }
    let fail = |e: io::Error| io::Error::new(e.kind(), format!("cannot open {uri}: {e}"));
    let (first, info) = connect_within(&uri, tls.as_ref(), nbd.open_timer).map_err(fail)?;
    if opts.writable && info.flags & NBD_FLAG_READ_ONLY != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "cannot open {uri} for writing: the server exports it read-only; mount without -w"
            ),
        ));
    }
    let count = match info.flags & NBD_FLAG_CAN_MULTI_CONN {
        0 => 1,
        _ => nbd.connections.max(1),
    };
    let name = uri.to_string();
    let max = nbd.max_in_flight.max(1);
    // Always: with a delay of 0 requests do not wait, but a lost server is still tried
    // again at the next request (conn.rs, `await_reconnect`).
    let redial = Some(Redial {
        uri: uri.clone(),
        info,
        delay: nbd.reconnect_delay,
        tls: tls.clone(),
    });
    let conn = |stream, info: &Info| Conn::new(stream, info, name.clone(), max, redial.clone());
    let mut conns = vec![conn(first, &info)?];
    for _ in 1..count {
        let (stream, more) = connect(&uri, tls.as_ref(), None).map_err(fail)?;
        let same = |i: &Info| (i.size, i.flags, i.allocation.is_some());
        if same(&more) != same(&info) {
            return Err(fail(io::Error::other(
                "the export changed between connections",
            )));
        }
        conns.push(conn(stream, &more)?);
    }
    let max_payload = info.max_block.min(u32::MAX / 2) / info.min_block * info.min_block;
    Ok(NbdBackend {
        uri,
        info,
        writable: opts.writable,
        conns: conns.into_boxed_slice(),
        max_payload,
        align: (info.min_block > 1).then(|| Align::new(info.min_block)),
    })
}

/// Opens `spec` as [`open`] does, as a disk image in `opts.format`: raw (the default, also
/// for [`Format::Auto`](crate::Format::Auto): an export's bytes are not probed, as a guest
/// could write a qcow2 header into a raw disk) or qcow2, the qcow2 layer over the export.
pub fn open_image(
    spec: &str,
    opts: &OpenOptions,
    nbd: &NbdOptions,
) -> io::Result<std::sync::Arc<dyn BlockBackend>> {
    open_image_recorded(spec, opts, nbd, None)
}

/// [`open_image`], recording what reaches the export (and, for qcow2, what the qcow2
/// layer is asked) in `log` ([`crate::record`]).
pub fn open_image_recorded(
    spec: &str,
    opts: &OpenOptions,
    nbd: &NbdOptions,
    log: Option<&std::sync::Arc<crate::record::WriteLog>>,
) -> io::Result<std::sync::Arc<dyn BlockBackend>> {
    use crate::record::{Level, RecordBackend};
    let export = std::sync::Arc::new(open(spec, opts, nbd)?);
    let export = RecordBackend::wrap(export, log, Level::Image);
    match opts.format {
        crate::Format::Qcow2 => {
            let disk = crate::qcow2::open_on_backend(export, spec, opts)?;
            Ok(RecordBackend::wrap(disk, log, Level::Guest))
        }
        _ => Ok(export),
    }
}

/// How often the first connection is tried while `open_timer` runs.
const OPEN_RETRY: Duration = Duration::from_millis(100);

/// [`connect`], tried again every [`OPEN_RETRY`] for up to `timer` while the server is not
/// there (the connection refused, the socket file missing); any other failure (the
/// handshake refused, TLS) is final at once.
fn connect_within(
    uri: &Uri,
    tls: Option<&tls::Client>,
    timer: Duration,
) -> io::Result<(stream::Stream, Info)> {
    let until = std::time::Instant::now() + timer;
    let mut said = false;
    loop {
        match connect(uri, tls, None) {
            Err(e) if not_there(&e) && std::time::Instant::now() < until => {
                if !std::mem::replace(&mut said, true) {
                    log::info!(
                        "nbd: {uri}: {e}; waiting up to {} s for the server (--open-timer)",
                        timer.as_secs()
                    );
                }
                if crate::sys::stop_pending() {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{e}; stopped waiting (--open-timer): SIGINT/SIGTERM"),
                    ));
                }
                log::debug!("nbd: {uri}: {e}; trying again");
                std::thread::sleep(OPEN_RETRY);
            }
            done => return done,
        }
    }
}

/// Whether a connection failed because nothing listens yet.
fn not_there(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::ENOENT | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// Connects to the server and negotiates the export; with a `limit`, each step (the
/// connect, each read or write of the handshake) fails with `TimedOut` after that long.
fn connect(
    uri: &Uri,
    tls: Option<&tls::Client>,
    limit: Option<Duration>,
) -> io::Result<(stream::Stream, Info)> {
    let mut stream = stream::Stream::connect(&uri.address, limit)?;
    let info = handshake::negotiate(&mut stream, &uri.export, tls)?;
    if limit.is_some() {
        stream.unbounded()?;
    }
    Ok((stream, info))
}

fn invalid(spec: &str, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("invalid image spec {spec:?}: {why}"),
    )
}

/// The most one block status request asks about (its length is a u32).
const STATUS_SPAN: u64 = 1 << 30;

/// Counts threads in the order they first reach an NBD backend (see the module docs).
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: usize = THREADS.fetch_add(1, Ordering::Relaxed);
}

impl NbdBackend {
    /// What the handshake settled.
    pub fn info(&self) -> Info {
        self.info
    }

    /// Connections open to the server.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    fn conn(&self) -> &Conn {
        let i = match self.conns.len() {
            1 => 0,
            n => THREAD.with(|t| *t) % n,
        };
        &self.conns[i]
    }

    fn has(&self, flag: u16) -> bool {
        self.info.flags & flag != 0
    }

    fn check_writable(&self) -> io::Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EROFS)),
        }
    }

    /// The end of `[offset, offset + len)`; `ENOSPC` if it is past the export.
    fn check_end(&self, offset: u64, len: u64) -> io::Result<u64> {
        let end = checked_end(offset, len)?;
        if end > self.info.size {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(end)
    }

    /// Reads `n` bytes at `offset` (whole blocks) into `bufs`, in commands of at most the
    /// largest payload.
    fn read_aligned(
        &self,
        cx: &Ctx<'_>,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
        n: u64,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < n {
            let mut window = iov::empty_window_mut();
            let want = (n - done).min(u64::from(self.max_payload)) as usize;
            let (used, covered) = iov::window_mut(bufs, done as usize, want, &mut window);
            let cmd = Cmd {
                kind: NBD_CMD_READ,
                flags: 0,
                offset: offset + done,
                len: covered as u32,
            };
            self.conn().call(cx, cmd, &[], Some(&mut window[..used]))?;
            done += covered as u64;
        }
        Ok(())
    }

    /// Writes `bufs` at `offset` (whole blocks), in commands of at most the largest payload.
    fn write_aligned(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        let total = iov::total(bufs) as u64;
        let mut done = 0;
        while done < total {
            let mut window = iov::empty_window();
            let want = (total - done).min(u64::from(self.max_payload)) as usize;
            let (used, covered) = iov::window(bufs, done as usize, want, &mut window);
            let cmd = Cmd {
                kind: NBD_CMD_WRITE,
                flags: 0,
                offset: offset + done,
                len: covered as u32,
            };
            self.conn().call(cx, cmd, &window[..used], None)?;
            done += covered as u64;
        }
        Ok(())
    }

    /// `NBD_CMD_WRITE_ZEROES` with `flags` over `[offset, offset + len)`: the partial
    /// blocks at either end written with zeroes by read-modify-write, one command for the
    /// whole blocks, held shared against read-modify-writes.
    fn zero_range(&self, cx: &Ctx<'_>, flags: u16, offset: u64, len: u64) -> io::Result<()> {
        let Some(align) = &self.align else {
            return self.ranged(cx, NBD_CMD_WRITE_ZEROES, flags, offset, len);
        };
        let end = offset + len;
        let (start, end) = match align.aligned(offset, len) {
            true => (offset, end),
            false => align.zero_edges(cx, self, offset, end)?,
        };
        if start < end {
            let _blocks = align.shared(cx, start, end);
            self.ranged(cx, NBD_CMD_WRITE_ZEROES, flags, start, end - start)?;
        }
        Ok(())
    }

    /// Commands without payload over `[offset, offset + len)`, each at most 1 GiB.
    fn ranged(&self, cx: &Ctx<'_>, kind: u16, flags: u16, offset: u64, len: u64) -> io::Result<()> {
        const PIECE: u64 = 1 << 30;
        let mut done = 0;
        while done < len {
            let n = (len - done).min(PIECE);
            let cmd = Cmd {
                kind,
                flags,
                offset: offset + done,
                len: n as u32,
            };
            self.conn().call(cx, cmd, &[], None)?;
            done += n;
        }
        Ok(())
    }

    /// Writes zeroes as data, for a server without `WRITE_ZEROES`.
    fn write_zero_data(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        static ZEROES: [u8; 64 << 10] = [0; 64 << 10];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(ZEROES.len() as u64) as usize;
            self.writev(cx, &[IoSlice::new(&ZEROES[..n])], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Blocks for NbdBackend {
    fn read_blocks(&self, cx: &Ctx<'_>, buf: &mut [u8], at: u64) -> io::Result<()> {
        let n = buf.len() as u64;
        self.read_aligned(cx, &mut [IoSliceMut::new(buf)], at, n)
    }

    fn write_blocks(&self, cx: &Ctx<'_>, buf: &[u8], at: u64) -> io::Result<()> {
        self.write_aligned(cx, &[IoSlice::new(buf)], at)
    }
}

impl BlockBackend for NbdBackend {
    fn len(&self) -> u64 {
        self.info.size
    }

    fn stats(&self) -> crate::BackendStats {
        let align = self.align.as_ref();
        crate::BackendStats {
            direct_syscalls: self.conns.iter().map(Conn::sent_now).sum(),
            bounced_reads: align.map_or(0, Align::bounced_reads),
            rmw_writes: align.map_or(0, Align::rmw_writes),
            bounce_buffers_allocated: align.map_or(0, Align::buffers_allocated),
            range_waits: align.map_or(0, Align::waits),
            ..crate::BackendStats::default()
        }
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        let total = iov::total(bufs) as u64;
        checked_end(offset, total)?;
        let n = total.min(self.info.size.saturating_sub(offset));
        match &self.align {
            _ if n == 0 => {}
            Some(align) if !align.aligned(offset, n) || !align.fits(bufs) => {
                align.read(cx, self, bufs, offset, n)?
            }
            _ => self.read_aligned(cx, bufs, offset, n)?,
        }
        Ok(n as usize)
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.check_writable()?;
        let total = iov::total(bufs) as u64;
        let end = self.check_end(offset, total)?;
        match &self.align {
            _ if total == 0 => Ok(()),
            None => self.write_aligned(cx, bufs, offset),
            Some(align) if align.aligned(offset, total) && align.fits(bufs) => {
                let _blocks = align.shared(cx, offset, end);
                self.write_aligned(cx, bufs, offset)
            }
            Some(align) => align.write(cx, self, bufs, offset),
        }
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        match self.writable && self.has(NBD_FLAG_SEND_FLUSH) {
            true => self.conn().call(cx, Cmd::bare(NBD_CMD_FLUSH), &[], None),
            false => Ok(()),
        }
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        self.check_writable()?;
        self.check_end(offset, len)?;
        match self.has(NBD_FLAG_SEND_WRITE_ZEROES) {
            true => self.zero_range(cx, 0, offset, len),
            false => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        }
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        self.check_writable()?;
        self.check_end(offset, len)?;
        if !self.has(NBD_FLAG_SEND_WRITE_ZEROES) {
            return self.write_zero_data(cx, offset, len);
        }
        let flags = if may_unmap { 0 } else { NBD_CMD_FLAG_NO_HOLE };
        self.zero_range(cx, flags, offset, len)
    }

    fn resize(&self, _cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        self.check_writable()?;
        match new_len.cmp(&self.info.size) {
            std::cmp::Ordering::Equal => Ok(()),
            // The export cannot grow: no space past its end (a qcow2 image over it).
            std::cmp::Ordering::Greater => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            std::cmp::Ordering::Less => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        }
    }

    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        let size = self.info.size;
        if offset >= size {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        if self.info.allocation.is_none() {
            return Ok(Extent::data(size));
        }
        // From the block holding `offset`, at most 1 GiB (a u32, whole blocks).
        let min = u64::from(self.info.min_block);
        let start = offset / min * min;
        let len = (size - start).min(STATUS_SPAN);
        let cmd = Cmd {
            kind: NBD_CMD_BLOCK_STATUS,
            flags: NBD_CMD_FLAG_REQ_ONE,
            offset: start,
            len: len as u32,
        };
        let mut desc = [0u8; DESCRIPTOR_LEN];
        let asked = self
            .conn()
            .call(cx, cmd, &[], Some(&mut [IoSliceMut::new(&mut desc)]));
        match asked {
            Ok(()) => {}
            // The server would not say (a range it refuses, or no status there after all):
            // all data is always a true answer.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                log::debug!("nbd: {}: block status at {start}: {e}", self.uri);
                return Ok(Extent::data(size));
            }
            Err(e) => return Err(e),
        }
        let extent = u64::from(u32::from_be_bytes(desc[..4].try_into().expect("4")));
        let state = u32::from_be_bytes(desc[4..].try_into().expect("4"));
        let end = start + extent.min(len);
        if end <= offset {
            // Shorter than a block (the spec's SHOULD, not a MUST): data to the end of the
            // block holding `offset` is a true answer.
            return Ok(Extent::data((start + min).min(size)));
        }
        // A hole only where the server says both: unallocated, and reads as zeroes.
        let hole = NBD_STATE_HOLE | NBD_STATE_ZERO;
        Ok(match state & hole == hole {
            true => Extent::hole(end),
            false => Extent::data(end),
        })
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        Ok(self.info.size)
    }

    fn read_only(&self) -> bool {
        !self.writable
    }

    fn abort(&self) {
        for conn in self.conns.iter() {
            conn.abort();
        }
    }

    fn describe(&self) -> String {
        let i = &self.info;
        let mut parts = vec![format!(
            "block sizes {}/{}/{}",
            i.min_block, i.pref_block, i.max_block
        )];
        parts.push(match i.structured {
            true => "structured replies".into(),
            false => "simple replies".into(),
        });
        parts.push(format!("{} connection(s)", self.conns.len()));
        if self.uri.tls {
            parts.push("TLS".into());
        }
        if !self.writable {
            parts.push("read-only".into());
        }
        format!("{} ({} bytes, {})", self.uri, i.size, parts.join(", "))
    }
}

impl Drop for NbdBackend {
    fn drop(&mut self) {
        for conn in self.conns.iter() {
            conn.disconnect();
        }
    }
}
