//! One connection to an NBD server, shared by every request that uses it, in any [`Ctx`].
//!
//! # How a reply reaches the request waiting for it
//! Each request takes a slot (its cookie is the slot's key and a generation), sends its
//! command, then waits for its reply. Nothing runs in the background: **the first waiter
//! becomes the reader**. A request that finds no reader takes the role and reads replies,
//! whoever they are for, until its own is complete and no further whole reply sits in the
//! receive buffer (`rx`: one read of the socket takes all the server has sent, often many
//! replies); replies for others are put in their slots and their owners woken. On leaving,
//! it hands the role to a parked request of its own loop if there is one (the role stays on
//! that loop: see Waiting), else releases it and wakes one parked request, which becomes
//! the next reader. So at iodepth 1 a request reads its own reply, with no hand-off, and a
//! busy connection always has exactly one reader.
//!
//! Sending: one writer at a time. A request that finds the writer busy copies its command
//! (and a write's payload up to [`STAGE_MAX`]) into the connection's send queue and goes on
//! to wait for its reply: the writer sends everything queued, in one `writev` per round,
//! before giving up the role. A larger payload waits for its turn to send from the caller's
//! buffers (woken in arrival order).
//!
//! Why not a reader coroutine per connection: a backend cannot start one on a loop it
//! does not own, one parked in `recv` would hold up the runtime's shutdown, and the
//! blocking dispatch modes would need a thread of their own. The rule above works the same
//! for coroutines and threads, and for a connection shared by several loops (a server
//! without `CAN_MULTI_CONN`).
//!
//! # Waiting
//! All state sits behind one `std::sync::Mutex`, held for a few field updates only, never
//! across I/O. A coroutine waiting for its reply while the reader is a coroutine of its own
//! loop parks with [`Co::wait_woken`](runtime::Co::wait_woken) and the reader wakes it
//! directly ([`Co::wake_local`](runtime::Co::wake_local): no system call). The role never
//! leaves a loop while such a waiter remains (the reader hands it over instead of releasing
//! it), so every locally parked waiter has a reader that can wake it. Otherwise a coroutine
//! polls its slot's [`EventFd`] through its own ring (the waker may be on any thread), and
//! a thread sleeps on the condition variable. Wake-ups are not remembered by the state, so
//! a waiter always checks its slot again after one.
//!
//! # Memory
//! The slab of slots, the wake-ups, the receive buffer and one payload buffer per slot are
//! made at open; a payload buffer grows to the largest read that another reader delivered
//! into it and stays, and so does the send queue: no allocation per request in steady
//! state. A request that reads its own reply reads it straight into the caller's buffers
//! (through the receive buffer below half its size).
//!
//! # Failure
//! A protocol violation ([`ProtoError`]) ends the connection with one log line: every
//! request in flight fails with `EIO`, and so does every later one. A socket error, or a
//! reply saying the server is shutting down (`ESHUTDOWN`: nbdkit's answer to what it read
//! as it quit, not done), loses it instead: the requests in flight wait for a new
//! connection and are sent again on it (`redial.rs`, `--reconnect-delay`), the last flush
//! at close like any other. A request whose waiter goes away (its coroutine cancelled)
//! leaves its slot to the reader, which frees it when the reply comes.
//!
//! [`ProtoError`]: super::proto::ProtoError

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runtime::{EventFd, LocalWaker};
use slab::Slab;

use super::proto::{Request, NBD_CMD_DISC, REQUEST_LEN};
use super::reply::{self, Expect, Progress, ReadError, Table, Wire};
use super::rx::{self, BufWire, RxBuf};
use super::stream::Stream;
use super::{Info, Uri};
use crate::iov::{self, WINDOW};
use crate::Ctx;

/// How long a coroutine sleeps before looking again for a free slot (all `max_in_flight`
/// in use: a rare state, so a timer, not a queue).
const FULL_NAP: Duration = Duration::from_micros(50);

/// A write's payload up to this size is copied into the send queue when the writer is
/// busy; a larger one waits for its turn to send from the caller's buffers.
pub const STAGE_MAX: usize = 64 << 10;

/// One command: `NBD_CMD_*`, its flags, offset and length.
#[derive(Clone, Copy, Debug)]
pub struct Cmd {
    /// `NBD_CMD_*`.
    pub kind: u16,
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// Byte offset in the export.
    pub offset: u64,
    /// Bytes (the payload's length for a write).
    pub len: u32,
}

impl Cmd {
    /// A command with no range (flush).
    pub fn bare(kind: u16) -> Cmd {
        Cmd {
            kind,
            flags: 0,
            offset: 0,
            len: 0,
        }
    }
}

/// A connection after its handshake.
pub struct Conn {
    structured: bool,
    redial: Option<Redial>,
    name: String,
    state: Mutex<State>,
    sleepers: Condvar,
    events: Box<[EventFd]>,
}

struct State {
    /// The socket; replaced when a lost connection is made again.
    stream: Arc<Stream>,
    /// Counts the sockets: a failure of an old one does not end a new one.
    epoch: u64,
    /// The id of `base:allocation` on this socket (ids are per connection).
    allocation: Option<u32>,
    /// `sendmsg` calls made outside the ring on the sockets replaced.
    sent_before: u64,
    /// Since when the connection is lost (requests wait for a new one).
    lost: Option<Instant>,
    /// A helper thread is making a new connection (connect and handshake), so that no
    /// loop thread blocks in them; the requests waiting look for its result.
    dialing: Option<std::thread::JoinHandle<io::Result<(Stream, Info)>>>,
    /// No attempt before this.
    next_try: Instant,
    /// When the last attempt at a new connection failed.
    failed_at: Option<Instant>,
    /// Requests have been failed for this loss already (logged once).
    gave_up: bool,
    slots: Slab<Slot>,
    max: usize,
    bufs: Box<[Vec<u8>]>,
    generation: u32,
    /// Someone reads replies (or the role was handed to `handed`, not yet running).
    reader: bool,
    /// The loop of the coroutine holding the reader role; `None` for a thread.
    reader_loop: Option<u64>,
    /// The slot the role was handed to.
    handed: Option<usize>,
    /// Received bytes not parsed yet; taken by the reader while it reads.
    rx: RxBuf,
    writer: bool,
    /// Large writes waiting for their turn to send.
    write_queue: VecDeque<usize>,
    /// Commands (and small payloads) queued for the writer to send.
    txq: Vec<u8>,
    /// The writer's other buffer: swapped with `txq` to send it.
    tx_spare: Vec<u8>,
    dead: bool,
    /// Threads asleep on `sleepers`.
    asleep: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for its turn to send.
    Queued,
    /// Given the turn to send by the last writer.
    WriteTurn,
    /// Sent, queued to send, or being sent: a reply may come.
    Sent,
    /// The connection was lost before its reply came: to be sent again on a new one.
    Lost,
    /// Complete.
    Done(Result<(), i32>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parked {
    /// Polling its slot's eventfd on its ring.
    Ring,
    /// In `wait_woken`, for the reader of its own loop to wake.
    Local(LocalWaker),
    /// A thread on the condition variable.
    Thread,
}

struct Slot {
    cookie: u64,
    expect: Expect,
    progress: Progress,
    phase: Phase,
    parked: Option<Parked>,
    /// Its waiter is gone: the reader frees the slot when the reply is complete.
    abandoned: bool,
    /// Another reader put (some of) its data in the slot's buffer: all of it goes there.
    into_buf: bool,
}

fn loop_of(cx: &Ctx<'_>) -> Option<u64> {
    match cx {
        Ctx::Coroutine(co) => Some(co.loop_id()),
        Ctx::Blocking => None,
    }
}

impl Conn {
    /// A connection over `stream` (handshake done, `info` what it settled) with room for
    /// `max_in_flight` requests; `name` (the URI) is for the log; made again when lost if
    /// `redial` says.
    pub fn new(
        stream: Stream,
        info: &Info,
        name: String,
        max: usize,
        redial: Option<Redial>,
    ) -> io::Result<Conn> {
        let events = (0..max)
            .map(|_| EventFd::new())
            .collect::<io::Result<_>>()?;
        let state = State {
            stream: Arc::new(stream),
            epoch: 0,
            allocation: info.allocation,
            sent_before: 0,
            lost: None,
            dialing: None,
            next_try: Instant::now(),
            failed_at: None,
            gave_up: false,
            slots: Slab::with_capacity(max),
            max,
            bufs: (0..max).map(|_| Vec::new()).collect(),
            generation: 0,
            reader: false,
            reader_loop: None,
            handed: None,
            rx: RxBuf::new(),
            writer: false,
            write_queue: VecDeque::with_capacity(max),
            txq: Vec::with_capacity(max * REQUEST_LEN),
            tx_spare: Vec::with_capacity(max * REQUEST_LEN),
            dead: false,
            asleep: 0,
        };
        Ok(Conn {
            structured: info.structured,
            redial,
            name,
            state: Mutex::new(state),
            sleepers: Condvar::new(),
            events,
        })
    }

    /// Sends `cmd` with `payload` (a write's data) and waits for its reply; a read's data
    /// lands in `dest`, which holds exactly `cmd.len` bytes. `EIO` once the connection
    /// has ended; the server's errno for a request it failed.
    pub fn call(
        &self,
        cx: &Ctx<'_>,
        cmd: Cmd,
        payload: &[IoSlice<'_>],
        dest: Option<&mut [IoSliceMut<'_>]>,
    ) -> io::Result<()> {
        let claim = Claim {
            conn: self,
            key: self.acquire(cx, cmd)?,
            cx,
        };
        let mut dest = dest;
        let mut waited = None;
        loop {
            let done = self
                .send(cx, claim.key, cmd, payload)
                .and_then(|()| self.await_reply(cx, claim.key, dest.as_deref_mut()));
            match done {
                Err(e) if is_lost(&e) => self.await_reconnect(cx, claim.key, &mut waited)?,
                done => return done,
            }
        }
    }

    /// `sendmsg` calls made outside the ring, on every socket the connection had.
    pub fn sent_now(&self) -> u64 {
        let st = self.lock();
        st.sent_before + st.stream.sent_now()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a free slot, waiting while all are in use.
    fn acquire(&self, cx: &Ctx<'_>, cmd: Cmd) -> io::Result<usize> {
        loop {
            let mut st = self.lock();
            if st.dead {
                return Err(eio());
            }
            if st.slots.len() < st.max {
                st.generation = st.generation.wrapping_add(1);
                let entry = st.slots.vacant_entry();
                let key = entry.key();
                let cookie = (u64::from(st.generation) << 32) | key as u64;
                st.slots.insert(Slot {
                    cookie,
                    expect: Expect {
                        kind: cmd.kind,
                        offset: cmd.offset,
                        len: cmd.len,
                    },
                    progress: Progress::default(),
                    phase: Phase::Queued,
                    parked: None,
                    abandoned: false,
                    into_buf: false,
                });
                return Ok(key);
            }
            match cx {
                Ctx::Coroutine(_) => {
                    drop(st);
                    cx.sleep(FULL_NAP)?;
                }
                Ctx::Blocking => {
                    st.asleep += 1;
                    st = self.sleepers.wait(st).unwrap_or_else(|e| e.into_inner());
                    st.asleep -= 1;
                }
            }
        }
    }

    /// Sends the command: at once if no one is sending, else queued for the writer (a
    /// small payload copied) or, for a large payload, when its turn comes.
    fn send(&self, cx: &Ctx<'_>, key: usize, cmd: Cmd, payload: &[IoSlice<'_>]) -> io::Result<()> {
        let mut st = self.lock();
        if st.dead {
            return Err(eio());
        }
        if st.lost.is_some() {
            return Err(lost());
        }
        let head = Request {
            flags: cmd.flags,
            kind: cmd.kind,
            cookie: st.slots[key].cookie,
            offset: cmd.offset,
            len: cmd.len,
        }
        .encode();
        if st.writer {
            if iov::total(payload) <= STAGE_MAX {
                // Findable by the reader before a byte leaves: the reply may beat us back.
                st.slots[key].phase = Phase::Sent;
                st.txq.extend_from_slice(&head);
                for part in payload {
                    st.txq.extend_from_slice(part);
                }
                return Ok(());
            }
            st.write_queue.push_back(key);
            while st.slots[key].phase == Phase::Queued {
                st = self.park(cx, key, st, false)?;
            }
            match st.slots[key].phase {
                Phase::WriteTurn => {}
                Phase::Lost => return Err(lost()),
                _ => return Err(eio()), // the connection ended meanwhile
            }
        } else {
            st.writer = true;
        }
        st.slots[key].phase = Phase::Sent;
        let (stream, epoch) = (Arc::clone(&st.stream), st.epoch);
        drop(st);
        let mut iov = [IoSlice::new(&[]); WINDOW + 1];
        iov[0] = IoSlice::new(&head);
        let n = payload.len().min(WINDOW);
        iov[1..=n].copy_from_slice(&payload[..n]);
        let sent = stream.write_all(cx, &mut iov[..=n]);
        let sent = sent.and_then(|()| self.send_queued(cx, &stream));
        sent.map_err(|e| {
            let e = self.fail(cx, epoch, &format!("cannot send: {e}"), true);
            // After `fail`: no one sends on this socket again, and no new one is made
            // while we hold the role.
            self.next_writer(&mut self.lock());
            e
        })
    }

    /// Sends what others queued meanwhile, round after round, then passes the turn on.
    fn send_queued(&self, cx: &Ctx<'_>, stream: &Stream) -> io::Result<()> {
        loop {
            let mut st = self.lock();
            if st.txq.is_empty() {
                self.next_writer(&mut st);
                return Ok(());
            }
            let mut batch = std::mem::take(&mut st.tx_spare);
            std::mem::swap(&mut batch, &mut st.txq);
            drop(st);
            let sent = stream.write_all(cx, &mut [IoSlice::new(&batch)]);
            batch.clear();
            self.lock().tx_spare = batch;
            sent?;
        }
    }

    /// Gives the turn to send to the next queued request, or frees it.
    fn next_writer(&self, st: &mut State) {
        if st.lost.is_some() {
            st.write_queue.clear(); // they were told (`lose`)
        }
        while let Some(key) = st.write_queue.pop_front() {
            if let Some(slot) = st.slots.get_mut(key).filter(|s| s.phase == Phase::Queued) {
                slot.phase = Phase::WriteTurn;
                self.wake(None, st, key);
                return;
            }
        }
        st.writer = false;
    }

    /// Waits until the reply to `key` is complete, reading replies meanwhile when no one
    /// else does; frees the slot.
    fn await_reply(
        &self,
        cx: &Ctx<'_>,
        key: usize,
        mut dest: Option<&mut [IoSliceMut<'_>]>,
    ) -> io::Result<()> {
        let mut st = self.lock();
        loop {
            let phase = st.slots[key].phase;
            if matches!(phase, Phase::Done(_) | Phase::Lost) && st.handed == Some(key) {
                self.pass_reader(cx, &mut st);
            }
            match phase {
                Phase::Done(result) => return self.finish(st, key, result, dest),
                Phase::Lost => return Err(lost()),
                _ => {}
            }
            if st.reader && st.handed != Some(key) {
                st = self.park(cx, key, st, true)?;
                continue;
            }
            (st.reader, st.reader_loop, st.handed) = (true, loop_of(cx), None);
            let rx = std::mem::take(&mut st.rx);
            let (stream, epoch) = (Arc::clone(&st.stream), st.epoch);
            drop(st);
            let mut role = ReaderRole { conn: self, cx, rx };
            let read = self.read_until(cx, &stream, key, dest.as_deref_mut(), &mut role.rx);
            if let Err((why, io)) = read {
                self.fail(cx, epoch, &why, io);
            }
            drop(role);
            st = self.lock();
        }
    }

    /// Reads replies until the one for `own` is complete and no whole reply is left in
    /// the receive buffer; `Err` says why the connection must end, and whether the socket
    /// failed (rather than the server breaking the protocol).
    fn read_until(
        &self,
        cx: &Ctx<'_>,
        stream: &Stream,
        own: usize,
        dest: Option<&mut [IoSliceMut<'_>]>,
        rx: &mut RxBuf,
    ) -> Result<(), (String, bool)> {
        let mut table = ConnTable {
            conn: self,
            cx,
            own,
            dest,
            own_done: false,
            shutting_down: false,
        };
        loop {
            let more = !table.own_done || rx::complete(rx.pending(), self.structured, &mut table);
            if !more {
                return Ok(());
            }
            let mut wire = BufWire {
                rx: &mut *rx,
                stream,
                cx,
            };
            match reply::read_one(&mut wire, &mut table, self.structured) {
                Ok(()) if table.shutting_down => {
                    return Err(("the server is shutting down (ESHUTDOWN)".into(), true))
                }
                Ok(()) => {}
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Err(("the server closed the connection".into(), true))
                }
                Err(ReadError::Io(e)) => return Err((format!("cannot receive: {e}"), true)),
                Err(ReadError::Proto(e)) => return Err((format!("protocol error: {e}"), false)),
            }
        }
    }

    /// Gives the reader role up: to a request of the same loop parked for its reply if
    /// there is one (woken directly: the role stays on this loop), else to whoever wakes
    /// first. After the connection ended, wakes every local waiter (their slots are done).
    fn pass_reader(&self, cx: &Ctx<'_>, st: &mut State) {
        let here = loop_of(cx);
        let local =
            |p: &Option<Parked>| matches!(p, Some(Parked::Local(w)) if Some(w.loop_id()) == here);
        if st.dead || st.lost.is_some() {
            let keys: Vec<usize> = st
                .slots
                .iter()
                .filter(|(_, s)| local(&s.parked))
                .map(|(k, _)| k)
                .collect();
            for key in keys {
                self.wake(Some(cx), st, key);
            }
        } else if let Some(key) = st
            .slots
            .iter()
            .find(|(_, s)| s.phase == Phase::Sent && local(&s.parked))
            .map(|(k, _)| k)
        {
            st.handed = Some(key);
            self.wake(Some(cx), st, key);
            return;
        }
        (st.reader, st.reader_loop, st.handed) = (false, None, None);
        let next = st
            .slots
            .iter()
            .find(|(_, s)| s.phase == Phase::Sent && s.parked.is_some())
            .map(|(k, _)| k);
        if let Some(key) = next {
            self.wake(Some(cx), st, key);
        }
    }

    /// Copies a read's data out of the slot's buffer if another reader put it there, then
    /// frees the slot.
    fn finish<'s>(
        &'s self,
        mut st: MutexGuard<'s, State>,
        key: usize,
        result: Result<(), i32>,
        dest: Option<&mut [IoSliceMut<'_>]>,
    ) -> io::Result<()> {
        let slot = &st.slots[key];
        if let (Ok(()), true, Some(dest)) = (result, slot.into_buf, dest) {
            let len = reply::reply_len(&slot.expect);
            let buf = std::mem::take(&mut st.bufs[key]);
            drop(st);
            iov::scatter(dest, 0, &buf[..len]);
            st = self.lock();
            st.bufs[key] = buf;
        }
        result.map_err(io::Error::from_raw_os_error)
    }

    /// Suspends (coroutine) or sleeps (thread) until `key`'s waker signals; the caller
    /// checks its slot again. A coroutine waiting for its reply (`for_reply`) while the
    /// reader runs on its own loop waits to be woken directly. Fails only when a
    /// coroutine's wait is cancelled.
    fn park<'s>(
        &'s self,
        cx: &Ctx<'_>,
        key: usize,
        mut st: MutexGuard<'s, State>,
        for_reply: bool,
    ) -> io::Result<MutexGuard<'s, State>> {
        match cx {
            Ctx::Coroutine(co) if for_reply && st.reader_loop == Some(co.loop_id()) => {
                st.slots[key].parked = Some(Parked::Local(co.local_waker()));
                drop(st);
                co.wait_woken();
                st = self.lock();
                st.slots[key].parked = None;
            }
            Ctx::Coroutine(co) => {
                st.slots[key].parked = Some(Parked::Ring);
                drop(st);
                let woken = co.ctx().poll(&self.events[key], libc::POLLIN);
                self.events[key].drain();
                st = self.lock();
                st.slots[key].parked = None;
                woken?;
            }
            Ctx::Blocking => {
                st.slots[key].parked = Some(Parked::Thread);
                st.asleep += 1;
                st = self.sleepers.wait(st).unwrap_or_else(|e| e.into_inner());
                st.asleep -= 1;
                st.slots[key].parked = None;
            }
        }
        Ok(st)
    }

    /// Wakes the waiter of `key`, if it is parked. A local waiter is woken only from its
    /// own loop (`cx`); the others are left to that loop's reader.
    fn wake(&self, cx: Option<&Ctx<'_>>, st: &State, key: usize) {
        match st.slots.get(key).and_then(|s| s.parked) {
            Some(Parked::Ring) => {
                let _ = self.events[key].signal();
            }
            Some(Parked::Local(waker)) => {
                if let Some(Ctx::Coroutine(co)) = cx {
                    co.wake_local(waker);
                }
            }
            Some(Parked::Thread) => self.sleepers.notify_all(),
            None => {}
        }
    }

    /// The socket of `epoch` failed (`io`) or the server broke the protocol: the
    /// connection is lost, to be made again, if `--reconnect-delay` allows and the socket
    /// failed; otherwise it ends ([`Conn::kill`]). Returns the error to fail with.
    fn fail(&self, cx: &Ctx<'_>, epoch: u64, why: &str, io: bool) -> io::Error {
        if self.redial.is_some() {
            let st = self.lock();
            if !st.dead && (st.epoch != epoch || st.lost.is_some()) {
                // An old socket: a reader still parsing what it buffered finds the
                // requests it answers gone to be sent again. Not the new socket's fault.
                return lost();
            }
        }
        match (&self.redial, io) {
            (Some(redial), true) => self.lose(cx, epoch, why, redial),
            _ => self.kill(cx, why),
        }
    }

    /// Marks the connection lost: every request in flight is told to send again once a
    /// new connection is up (one log line); requests whose waiter is gone are dropped.
    fn lose(&self, cx: &Ctx<'_>, epoch: u64, why: &str, redial: &Redial) -> io::Error {
        let mut st = self.lock();
        if st.dead {
            return eio();
        }
        if st.epoch != epoch || st.lost.is_some() {
            return lost(); // told already
        }
        match redial.delay.is_zero() {
            true => log::warn!(
                "nbd: {}: {why}; its requests fail with EIO, and each new one tries a new \
                 connection first (--reconnect-delay S makes them wait instead)",
                self.name
            ),
            false => log::warn!(
                "nbd: {}: {why}; reconnecting (requests wait up to {:?})",
                self.name,
                redial.delay
            ),
        }
        st.lost = Some(Instant::now());
        (st.failed_at, st.gave_up) = (None, false);
        st.stream.shutdown();
        let keys: Vec<usize> = st.slots.iter().map(|(k, _)| k).collect();
        for key in keys {
            match st.slots[key].phase {
                Phase::Done(_) => continue,
                // Handed the turn to send and not sending yet: it will find itself lost
                // and never send, so the turn is free (else no new connection is made).
                Phase::WriteTurn => st.writer = false,
                _ => {}
            }
            let slot = &mut st.slots[key];
            if slot.abandoned {
                st.slots.remove(key);
                continue;
            }
            slot.phase = Phase::Lost;
            self.wake(Some(cx), &st, key);
        }
        st.write_queue.clear();
        st.txq.clear();
        if st.asleep > 0 {
            self.sleepers.notify_all();
        }
        lost()
    }

    /// Ends the connection: every request in flight fails with `EIO`, one log line says why.
    /// Returns the `EIO` for the caller to fail with.
    fn kill(&self, cx: &Ctx<'_>, why: &str) -> io::Error {
        let mut st = self.lock();
        if !st.dead {
            st.dead = true;
            log::error!(
                "nbd: {}: {why}; connection closed, its requests fail with EIO",
                self.name
            );
            let keys: Vec<usize> = st.slots.iter().map(|(k, _)| k).collect();
            for key in keys {
                let slot = &mut st.slots[key];
                if !matches!(slot.phase, Phase::Done(_)) {
                    slot.phase = Phase::Done(Err(libc::EIO));
                    self.wake(Some(cx), &st, key);
                }
            }
            st.slots.retain(|_, s| !s.abandoned);
            st.write_queue.clear();
            st.txq.clear();
            st.stream.shutdown();
        }
        if st.asleep > 0 {
            self.sleepers.notify_all();
        }
        eio()
    }

    /// Ends the connection now, from any thread, reconnecting or not: every request in
    /// flight and every later one fails with `EIO` (the socket is shut down, so a reader
    /// blocked in it wakes and wakes the waiters of its loop).
    pub fn abort(&self) {
        self.kill(&Ctx::Blocking, "given up: the daemon is stopping");
    }

    /// Says goodbye (`NBD_CMD_DISC`, blocking) and closes, unless the connection ended.
    pub fn disconnect(&self) {
        let stream = {
            let st = self.lock();
            if st.dead || st.lost.is_some() {
                return;
            }
            Arc::clone(&st.stream)
        };
        let disc = Request {
            flags: 0,
            kind: NBD_CMD_DISC,
            cookie: 0,
            offset: 0,
            len: 0,
        }
        .encode();
        let _ = stream.write_all(&Ctx::Blocking, &mut [IoSlice::new(&disc)]);
        stream.shutdown();
    }
}

#[cfg(test)]
#[path = "conn_tests.rs"]
mod tests;

#[path = "redial.rs"]
mod redial;
pub use redial::Redial;

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// The connection was lost, and the request is to be sent again: never reaches a caller.
fn lost() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOTCONN)
}

fn is_lost(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOTCONN)
}

/// A request's hold on its slot: freed on return, or left to the reader (abandoned) if its
/// reply may still come; also on unwinding.
struct Claim<'c, 'x> {
    conn: &'c Conn,
    key: usize,
    cx: &'c Ctx<'x>,
}

impl Drop for Claim<'_, '_> {
    fn drop(&mut self) {
        let conn = self.conn;
        let mut st = conn.lock();
        let key = self.key;
        if st.handed == Some(key) {
            conn.pass_reader(self.cx, &mut st); // handed the role, but going away
        }
        match st.slots[key].phase {
            Phase::Sent => {
                let slot = &mut st.slots[key];
                (slot.abandoned, slot.parked) = (true, None);
                return;
            }
            Phase::Queued => st.write_queue.retain(|&k| k != key),
            Phase::WriteTurn => {
                st.slots[key].phase = Phase::Done(Err(libc::ECANCELED));
                conn.next_writer(&mut st);
            }
            Phase::Done(_) | Phase::Lost => {}
        }
        st.slots.remove(key);
        if st.asleep > 0 {
            conn.sleepers.notify_all();
        }
    }
}

/// The reader role and the receive buffer it holds, given back (or handed on) on drop,
/// also on unwinding.
struct ReaderRole<'c, 'x> {
    conn: &'c Conn,
    cx: &'c Ctx<'x>,
    rx: RxBuf,
}

impl Drop for ReaderRole<'_, '_> {
    fn drop(&mut self) {
        let mut st = self.conn.lock();
        st.rx = std::mem::take(&mut self.rx);
        self.conn.pass_reader(self.cx, &mut st);
    }
}

/// The slots as the reader's [`Table`]: its own request's data goes straight to `dest`,
/// others' to their slot's buffer.
struct ConnTable<'c, 'x, 'd, 'b> {
    conn: &'c Conn,
    cx: &'c Ctx<'x>,
    own: usize,
    dest: Option<&'d mut [IoSliceMut<'b>]>,
    own_done: bool,
    /// A reply said `ESHUTDOWN`: the server goes away without doing the request, which is
    /// sent again on a new connection (the connection is lost, not its requests).
    shutting_down: bool,
}

/// The slot key in a cookie.
fn key_of(cookie: u64) -> usize {
    (cookie & 0xffff_ffff) as usize
}

impl ConnTable<'_, '_, '_, '_> {
    /// Runs `f` on the bytes `[at, at + len)` of `cookie`'s data: the caller's buffers for
    /// our own request (unless some of it already went to the slot's buffer), else the
    /// slot's. A request that ended meanwhile ([`Conn::abort`] from another thread: its
    /// owner may have freed the slot) gets its bytes read into the slot's buffer, unused.
    fn with_dest<R>(
        &mut self,
        cookie: u64,
        at: usize,
        len: usize,
        f: impl FnOnce(&mut [IoSliceMut<'_>], usize) -> R,
    ) -> R {
        let key = key_of(cookie);
        let mut st = self.conn.lock();
        let need = match st.slots.get_mut(key) {
            Some(slot) if key == self.own || live(slot, cookie) => {
                if key == self.own && !slot.into_buf {
                    if let Some(dest) = self.dest.as_deref_mut() {
                        drop(st);
                        return f(dest, at);
                    }
                }
                slot.into_buf = true;
                reply::reply_len(&slot.expect)
            }
            _ => at + len,
        };
        let mut buf = std::mem::take(&mut st.bufs[key]);
        drop(st);
        if buf.len() < need {
            buf.resize(need, 0); // grows to the high-water mark, then stays
        }
        let result = f(&mut [IoSliceMut::new(&mut buf[at..at + len])], 0);
        self.conn.lock().bufs[key] = buf;
        result
    }
}

/// Whether `slot` still waits for the reply to `cookie`.
fn live(slot: &Slot, cookie: u64) -> bool {
    slot.cookie == cookie && slot.phase == Phase::Sent
}

impl Table for ConnTable<'_, '_, '_, '_> {
    fn expect(&mut self, cookie: u64) -> Option<(Expect, Progress)> {
        let st = self.conn.lock();
        let slot = st.slots.get(key_of(cookie))?;
        let waiting = slot.cookie == cookie && slot.phase == Phase::Sent;
        waiting.then_some((slot.expect, slot.progress))
    }

    fn allocation_context(&mut self) -> Option<u32> {
        self.conn.lock().allocation
    }

    fn data(&mut self, cookie: u64, at: usize, len: usize, wire: &mut dyn Wire) -> io::Result<()> {
        self.with_dest(cookie, at, len, |bufs, at| {
            reply::read_into(wire, bufs, at, len)
        })
    }

    fn hole(&mut self, cookie: u64, at: usize, len: usize) {
        self.with_dest(cookie, at, len, |bufs, at| reply::zero_at(bufs, at, len))
    }

    fn progress(&mut self, cookie: u64, progress: Progress) {
        let key = key_of(cookie);
        let mut st = self.conn.lock();
        if let Some(slot) = st.slots.get_mut(key) {
            if key == self.own || live(slot, cookie) {
                slot.progress = progress;
            }
        }
    }

    fn done(&mut self, cookie: u64, result: Result<(), i32>) {
        let key = key_of(cookie);
        let mut st = self.conn.lock();
        let Some(slot) = st.slots.get_mut(key) else {
            return; // ended meanwhile (`Conn::abort`), its owner gone
        };
        if key != self.own && !live(slot, cookie) {
            return;
        }
        if result == Err(libc::ESHUTDOWN) && self.conn.redial.is_some() {
            self.shutting_down = true; // the slot stays `Sent`, for `lose` to find
            return;
        }
        slot.phase = Phase::Done(result);
        if key == self.own {
            self.own_done = true;
        } else if slot.abandoned {
            st.slots.remove(key);
            if st.asleep > 0 {
                self.conn.sleepers.notify_all();
            }
        } else {
            self.conn.wake(Some(self.cx), &st, key);
        }
    }
}
