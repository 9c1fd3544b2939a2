//! Making a lost connection again (`--reconnect-delay`), for the requests waiting for it.
//!
//! A socket that fails, or a server that answers `ESHUTDOWN` (it is shutting down and did
//! not do the request), loses the connection ([`Conn::lose`]) rather than ending it: every
//! request in flight waits here. The first one to find no one reading, sending or dialing
//! starts one attempt (connect and handshake) on a helper thread, so that no loop thread
//! blocks in it; the others nap on their ring or thread, and whoever finds the attempt over
//! installs its result. A new connection must agree with the first one on the size, the
//! flags and the reply kind; the requests are then sent again with new cookies.
//!
//! # When a request gives up (`EIO`)
//! The delay runs from the loss a request first waited for. A request that came before it
//! ran out fails when it runs out, even while an attempt is under way. One that came after
//! (every request, with the default delay of 0) gets one try: it fails once an attempt made
//! since it came has failed (or one failed less than [`RETRY_AFTER`] ago: no storm of
//! attempts while the server is away), or once the connection made for it is lost again (a
//! server that accepts and then drops every connection, or answers every request
//! `ESHUTDOWN`, would otherwise keep it going round for ever). A connection that served the
//! request for the delay (at least [`FRESH_AFTER`]) makes its next loss a new wait.
//!
//! Each attempt is bounded ([`ATTEMPT_LIMIT`] per step), so that a server that accepts and
//! then says nothing (frozen, or a TCP peer that drops the SYN) cannot hold the attempts
//! after it. The connection stays lost, not dead, so that each later request tries again,
//! as QEMU's nbd driver does: a restarted server is used again without a remount.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{eio, Conn, Info, Phase, State, Stream, Uri};
use crate::nbd::reply::Progress;
use crate::Ctx;

/// How often a request waiting for a lost connection looks again, and how soon after a
/// failed attempt the next one is made.
const RECONNECT_NAP: Duration = Duration::from_millis(20);
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// How long one attempt at a new connection may wait for the server at each step (the
/// connect, each read or write of the handshake).
const ATTEMPT_LIMIT: Duration = Duration::from_secs(5);

/// A request sent again on a new connection that served it at least this long (or the
/// delay, if longer) waits afresh when that connection is lost too.
const FRESH_AFTER: Duration = Duration::from_secs(1);

/// What a connection needs to be made again when it is lost (`--reconnect-delay`).
#[derive(Clone, Debug)]
pub struct Redial {
    /// Where the server is.
    pub uri: Uri,
    /// What the first handshake settled: a new connection must agree on the size, the
    /// flags and the reply kind.
    pub info: Info,
    /// How long requests wait for a new connection before failing with `EIO`.
    pub delay: Duration,
    /// TLS, if the first connection has it.
    pub tls: Option<crate::nbd::tls::Client>,
}

/// What a request waiting for a new connection keeps across the losses it sees.
#[derive(Clone, Copy, Debug)]
pub(super) struct Waited {
    /// The loss it first waited for: its delay runs from there.
    lost_at: Instant,
    /// When it began to wait.
    arrived: Instant,
    /// When it was last sent again on a new connection.
    resent_at: Option<Instant>,
}

impl Conn {
    /// Waits until the connection is made again (making it, when no one else is) and
    /// readies `key` to be sent again; `EIO` as the module docs say. `waited` is the
    /// request's own record, `None` before its first wait.
    pub(super) fn await_reconnect(
        &self,
        cx: &Ctx<'_>,
        key: usize,
        waited: &mut Option<Waited>,
    ) -> io::Result<()> {
        let redial = self.redial.as_ref().ok_or_else(eio)?;
        let fresh = redial.delay.max(FRESH_AFTER);
        if waited.is_some_and(|w| w.resent_at.is_some_and(|t| t.elapsed() >= fresh)) {
            *waited = None; // the connection it was sent again on served it long enough
        }
        loop {
            let mut st = self.lock();
            if st.dead {
                return Err(eio());
            }
            let now = Instant::now();
            let w = waited.get_or_insert(Waited {
                lost_at: st.lost.unwrap_or(now),
                arrived: now,
                resent_at: None,
            });
            if st.lost.is_none() {
                w.resent_at = Some(now);
                st.generation = st.generation.wrapping_add(1);
                let cookie = (u64::from(st.generation) << 32) | key as u64;
                let slot = &mut st.slots[key];
                (slot.cookie, slot.phase) = (cookie, Phase::Queued);
                (slot.progress, slot.into_buf) = (Progress::default(), false);
                return Ok(());
            }
            if st.dialing.as_ref().is_some_and(|d| d.is_finished()) {
                let dialed = st.dialing.take().expect("checked").join();
                let dialed = dialed.unwrap_or_else(|_| Err(io::Error::other("dialer panicked")));
                self.install(&mut st, redial, dialed);
                continue;
            }
            let expiry = w.lost_at + redial.delay;
            let expired = now >= expiry;
            let failed_since = st
                .failed_at
                .is_some_and(|t| t >= w.arrived || now.duration_since(t) < RETRY_AFTER);
            if expired && (w.arrived < expiry || w.resent_at.is_some() || failed_since) {
                if !std::mem::replace(&mut st.gave_up, true) && !redial.delay.is_zero() {
                    log::error!(
                        "nbd: {}: not reconnected within {:?}; requests fail with EIO, and \
                         each new one tries a new connection first",
                        self.name,
                        redial.delay
                    );
                }
                return Err(eio());
            }
            let idle = !st.reader && !st.writer && st.dialing.is_none();
            if idle && (expired || now >= st.next_try) {
                match Self::dial(redial) {
                    Ok(dialing) => st.dialing = Some(dialing),
                    Err(e) => self.install(&mut st, redial, Err(e)), // a failed attempt
                }
            }
            drop(st);
            cx.sleep(RECONNECT_NAP)?;
        }
    }

    /// Starts one attempt at a new connection on a helper thread.
    #[allow(clippy::type_complexity)]
    fn dial(redial: &Redial) -> io::Result<std::thread::JoinHandle<io::Result<(Stream, Info)>>> {
        let (uri, tls) = (redial.uri.clone(), redial.tls.clone());
        std::thread::Builder::new()
            .name("nbd-redial".into())
            .spawn(move || crate::nbd::connect(&uri, tls.as_ref(), Some(ATTEMPT_LIMIT)))
    }

    /// Installs a new connection if it was made and the export is the same.
    fn install(&self, st: &mut State, redial: &Redial, dialed: io::Result<(Stream, Info)>) {
        let made = dialed.and_then(|(stream, info)| {
            let same = |i: &Info| (i.size, i.flags, i.structured, i.allocation.is_some());
            match same(&info) == same(&redial.info) {
                true => Ok((stream, info.allocation)),
                false => Err(io::Error::other(format!(
                    "the export changed (size {} bytes, flags {:#x})",
                    info.size, info.flags
                ))),
            }
        });
        match made {
            Ok((stream, allocation)) => {
                st.allocation = allocation;
                log::info!("nbd: {}: reconnected", self.name);
                st.sent_before += st.stream.sent_now();
                st.stream = Arc::new(stream);
                st.epoch += 1;
                st.lost = None;
                (st.failed_at, st.gave_up) = (None, false);
                st.rx.clear();
                st.txq.clear();
            }
            Err(e) => {
                log::debug!("nbd: {}: reconnecting: {e}", self.name);
                st.next_try = Instant::now() + RETRY_AFTER;
                st.failed_at = Some(Instant::now());
            }
        }
    }
}
