//! The coroutine transport: /dev/fuse read by the loop's coroutines, one coroutine per
//! request (QEMU's design in its coroutine series).
//!
//! A queue keeps `readers` readers. When a read returns a request, its coroutine
//! *becomes* the request's coroutine: it decodes, runs [`FileSystem::handle`] with
//! [`Ctx::Coroutine`] (suspending on the backend's io_uring operations) and writes the
//! reply. Reading is handed over lazily ([`Co::on_first_suspend`]): only if serving has to
//! suspend does the coroutine spawn a replacement reader, just before it suspends, and end
//! once its request is done; a request served without suspending (the page cache, the null
//! backend) is followed by the same coroutine reading the next one. So a request costs at
//! most one pooled spawn, none when it never waits, and no hand-off of buffers. The buffer
//! puts WRITE data and READ replies on a page boundary ([`crate::buffers`]), so O_DIRECT
//! images need no bounce.
//!
//! Reading: /dev/fuse is opened `O_NONBLOCK`, and a reader reads it with `read(2)`, which
//! takes a queued request at once or fails with `EAGAIN`; only then does the reader wait
//! for `POLLIN` through the ring, and read again. Not with a read on the ring: that one
//! suspends the coroutine until the loop's next `io_uring_enter` even when a request is
//! there, and the kernel polls the device before it reads (no `FMODE_NOWAIT`). fio, null
//! export, 4 KiB psync randread: a ring read served 0.75x (one job) and 0.7x (two jobs)
//! of `read(2)` first (benches/HISTORY.md, 2026-12-06).
//!
//! Clients by turns ([`crate::backlog`]): the kernel queues every client's requests in one
//! FIFO, where a client at iodepth 1 waits behind a client at 64 (fio, null: its p99
//! 5.6x its p99 alone). A reader that finds requests queued right after serving one may
//! *drain*: read what is queued into the queue's backlog and start those requests one file
//! handle at a time; when, and how many, is [`crate::read_ahead`]'s. Requests in the
//! backlog are served even when the queue pauses or stops.
//!
//! Waiting when idle, in a blocking read (`QueueConfig::block_when_idle`, `--idle-wait
//! block`): every request wakes every ring poll of /dev/fuse through task work, where a
//! thread blocked in `read(2)` is an exclusive waiter the kernel wakes alone (at one
//! request at a time a loop made 6.7 system calls a request, a blocking thread 3:
//! benches/HISTORY.md, 2026-12-07). So, while the requests it waits for are slow to serve
//! ([`SLOW_SERVICE`]: a disk, where the ring's poll serves fast ones better), a queue
//! keeps one waiter at most (a reader that finds nothing while another waits, and the
//! loop has nothing else in flight, ends), and that waiter, when its loop has nothing
//! else to do ([`Co::block_while_idle`]), waits in a blocking read of a blocking clone of
//! the fd; a wake-up of the loop (a stop, a pause, a snapshot: the loop's background
//! eventfds) ends that read. A request it brings, or one the loop waited for through the
//! ring while alone, is served with blocking calls and its reply goes to the fd it came
//! from; a request found queued never is (at iodepth 64 each would then leave the loop
//! alone again, and it would serve one request at a time), nor one that may stall
//! ([`FileSystem::waits_are_bounded`], SETLKW): that one runs in a coroutine. A deep
//! client's requests piling up behind one so served send the queue back to its ring for
//! [`DEEP_HOLD`]. `--idle-wait block` is the default.
//!
//! Stopping ([`Queue::stop`]): no new reader is spawned, the readers' waits are
//! cancelled, requests in flight finish and reply. A queue also ends by itself when the
//! file system is unmounted (reads fail with `ENODEV`).
//!
//! Pausing ([`Queue::pause`], [`Queue::resume`]): the same without the end: the queue
//! takes no new request (its readers' waits are cancelled, requests in flight finish)
//! until it is resumed, leaving the session's requests to the other queues. The loop
//! placement ([`crate::placement`]) pauses a queue where that serves the session more.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::affinity::CpuSet;
use runtime::Ctx;
use runtime::{Co, TaskId, WaitQueue};

use crate::accounting::{Accounting, OpReport, RequestClock};
use crate::backlog::{Backlog, Turn};
use crate::buffers::{Buffers, RequestBuf};
use crate::dispatch::{serve_request, whole_request, QueueStats, Served};
use crate::read_ahead::{bytes_moved, ReadAhead, BACKLOG, DRAIN_BYTES};
use crate::FileSystem;
use fuse::abi::FUSE_SETLKW;
use fuse::decode::header_of;
use fuse::dev::{classify_read, FuseDev, Received};

/// How a queue runs.
#[derive(Clone, Copy, Debug)]
pub struct QueueConfig {
    /// Reads of /dev/fuse kept outstanding.
    pub readers: usize,
    /// Send replies through the ring (batched with the next submission) instead of a
    /// direct `writev(2)`.
    pub ring_replies: bool,
    /// `inline` dispatch, the model QEMU had before coroutines: one reader, and each
    /// request runs to completion on the loop with blocking syscalls, no coroutine of its
    /// own. For comparison with the default (one coroutine per request).
    pub inline: bool,
    /// Per-request accounting per opcode ([`crate::accounting`]); costs a few clock reads
    /// per request.
    pub account: bool,
    /// When the loop has nothing else to do, wait for the next request in a blocking
    /// `read(2)` on the loop's thread and serve it with blocking calls (see the module).
    pub block_when_idle: bool,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            readers: 2,
            ring_replies: false,
            inline: false,
            account: false,
            block_when_idle: false,
        }
    }
}

/// What a reader got from a read of /dev/fuse ([`Queue::read_one`]).
enum Read {
    /// A request of this many bytes.
    Request(usize),
    /// Nothing queued (`EAGAIN`).
    Empty,
    /// Interrupted, or a request that was aborted meanwhile: read again.
    Interrupted,
    /// The file system is unmounted.
    Unmounted,
}

/// What a coroutine reader got from [`Queue::next_request`].
enum Next {
    /// A request of this many bytes in this buffer, and how it came.
    Request(RequestBuf, usize, Came),
    /// Nothing: another reader of the queue already waits (`block_when_idle`).
    Surplus,
    /// Nothing: the queue is paused (the backlog is empty).
    Paused,
    /// Nothing: the queue stops, or the file system is unmounted (the backlog is empty).
    Ended,
}

/// How a request came to a coroutine reader: what decides how it is served
/// ([`Queue::how_to_serve`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Came {
    /// Found queued (in /dev/fuse or the backlog).
    Queued,
    /// Waited for through the ring: /dev/fuse held none before it.
    Waited,
    /// Read in a blocking `read(2)` of [`Queue::blocking`] (its reply goes there).
    Blocked,
}

/// How long a queue waits through the ring and serves in coroutines only, once two
/// requests in a row were found queued right after one served slowly with blocking calls
/// (`block_when_idle`): a deep client's requests would each wait behind the one the loop
/// serves blocking (fio, ext4 `--direct`, iodepth 64: 0.77-0.85x without this).
const DEEP_HOLD: Duration = Duration::from_millis(100);

/// A request that takes longer than this to serve is slow: a disk read, not a cached or
/// null one (a few microseconds). Only while the requests it waits for are slow does a
/// loop block: at one fast request at a time the ring serves more (fio, null export,
/// psync: blocking 0.87x), as the loop on the client's CPU takes the request there; and a
/// request served slowly with blocking calls held the loop long enough for a deep client's
/// requests to pile up behind it (a fast client at iodepth 1 may have its next one
/// queued by then, so only slow ones are watched).
const SLOW_SERVICE: Duration = Duration::from_micros(20);

/// Requests a reader reads back to back before it lets the event loop reap completions
/// once ([`Queue::let_the_loop_in`]).
const STREAK: u32 = 1024;

/// What the `inline` reader got from [`Queue::receive`].
enum Got {
    /// A request of this many bytes.
    Request(usize),
    /// Nothing: the queue is paused.
    Paused,
    /// Nothing: the queue stops, or the file system is unmounted.
    Ended,
}

/// One /dev/fuse fd served by coroutines of one event loop, for the file system `F`.
pub struct Queue<F: FileSystem> {
    dev: FuseDev,
    /// A blocking clone of `dev`, for the loop's idle wait (`block_when_idle`).
    blocking: Option<FuseDev>,
    /// The loop thread's own CPUs, and the process's: it floats on the latter while it
    /// blocks ([`Queue::float`]), if they differ.
    float: Option<(CpuSet, CpuSet)>,
    /// Whether the loop thread floats now.
    floating: Cell<bool>,
    /// Readers waiting for /dev/fuse to become readable.
    waiting: Cell<usize>,
    /// How long the requests the loop waited for took to serve, averaged (each new one
    /// weighs 1/8), in nanoseconds: the loop blocks only while they are slow
    /// ([`SLOW_SERVICE`]).
    waited_service_ns: Cell<u64>,
    /// Requests found queued in a row since one was served slowly with blocking calls
    /// ([`SLOW_SERVICE`]), plus one; 0 when not watching. Two in a row is a deep client's
    /// pile (a client at iodepth 1 has one request at most, and the other loop's blocked
    /// read may leave that one queued a moment).
    queued_after_slow: Cell<u8>,
    /// Until when the loop neither blocks nor serves with blocking calls: requests piled
    /// up behind one slowly so served, a deep client's, whose requests would pile up
    /// behind every blocking call ([`DEEP_HOLD`]).
    deep_until: Cell<Option<Instant>>,
    /// The file system's [`FileSystem::waits_are_bounded`]: whether a request may be
    /// served with blocking calls.
    bounded: bool,
    fs: Arc<F>,
    config: QueueConfig,
    buffers: Buffers,
    stopping: Cell<bool>,
    /// Taking no new request until resumed ([`Queue::pause`]).
    paused: Cell<bool>,
    /// When the current pause began (for `QueueStats::paused_ms`).
    paused_since: Cell<Option<std::time::Instant>>,
    /// Where the requests read are also counted for the loop placement, if anywhere.
    counted: RefCell<Option<Arc<AtomicU64>>>,
    /// Readers reading or waiting on /dev/fuse, for cancellation at stop or pause.
    readers: RefCell<Vec<TaskId>>,
    /// Requests taken from /dev/fuse and not started yet, each in its buffer.
    backlog: RefCell<Backlog<(RequestBuf, usize)>>,
    /// When and how much to drain into the backlog.
    read_ahead: ReadAhead,
    live_readers: Cell<usize>,
    in_flight: Cell<usize>,
    /// Requests read back to back since a reader last let the loop reap
    /// ([`Queue::let_the_loop_in`]).
    streak: Cell<u32>,
    finished: WaitQueue,
    stats: RefCell<QueueStats>,
    accounting: RefCell<Accounting>,
    /// Why the request stream became unusable, if it did (the queue then stops).
    failure: RefCell<Option<String>>,
}

impl<F: FileSystem> Queue<F> {
    /// A queue on `dev` (which must be `O_NONBLOCK`) for requests of at most `max_write`
    /// bytes of data. With `block_when_idle`, also opens a blocking clone of `dev`; if that fails the
    /// loop waits through its ring, as without.
    pub fn new(dev: FuseDev, fs: Arc<F>, max_write: u32, config: QueueConfig) -> Rc<Queue<F>> {
        let blocking = (config.block_when_idle && !config.inline)
            .then(|| {
                dev.clone_queue(false)
                    .inspect_err(|e| {
                        log::warn!(
                            "no blocking clone of /dev/fuse ({e}): the loop waits on its ring"
                        )
                    })
                    .ok()
            })
            .flatten();
        let float = blocking.as_ref().and_then(|_| {
            let process = CpuSet::of_thread(std::process::id() as libc::pid_t).ok()?;
            let home = CpuSet::of_thread(0).ok()?;
            (home != process).then_some((home, process))
        });
        Rc::new(Queue {
            dev,
            blocking,
            float,
            floating: Cell::new(false),
            waiting: Cell::new(0),
            waited_service_ns: Cell::new(0),
            queued_after_slow: Cell::new(0),
            deep_until: Cell::new(None),
            bounded: fs.waits_are_bounded(),
            fs,
            config,
            buffers: Buffers::new(max_write),
            stopping: Cell::new(false),
            paused: Cell::new(false),
            paused_since: Cell::new(None),
            counted: RefCell::new(None),
            readers: RefCell::new(Vec::new()),
            backlog: RefCell::new(Backlog::with_capacity(BACKLOG)),
            read_ahead: ReadAhead::new(),
            live_readers: Cell::new(0),
            in_flight: Cell::new(0),
            streak: Cell::new(0),
            finished: WaitQueue::new(),
            stats: RefCell::new(QueueStats::default()),
            accounting: RefCell::new(Accounting::default()),
            failure: RefCell::new(None),
        })
    }

    /// Starts the readers.
    pub fn start(self: &Rc<Self>, co: &Co<'_>) -> io::Result<()> {
        let readers = if self.config.inline {
            1
        } else {
            self.config.readers.max(1)
        };
        for _ in 0..readers {
            self.spawn_reader(co)?;
        }
        Ok(())
    }

    /// Stops taking requests: cancels the readers' waits; requests in flight finish.
    pub fn stop(&self, co: &Co<'_>) {
        if self.stopping.replace(true) {
            return;
        }
        self.cancel_waits(co);
        // A paused queue may have nothing left to end by itself.
        if self.is_finished() {
            self.finished.wake_all(co);
        }
    }

    /// Takes no new request until [`resume`](Self::resume): cancels the readers' waits
    /// (a reader that already holds a request serves it); requests in flight finish. The
    /// queue is not finished while paused. Unlike [`stop`](Self::stop) this is undone.
    /// Pausing a paused queue does nothing.
    pub fn pause(&self, co: &Co<'_>) {
        if self.stopping.get() || self.paused.replace(true) {
            return;
        }
        self.paused_since.set(Some(std::time::Instant::now()));
        self.stats.borrow_mut().pauses += 1;
        self.cancel_waits(co);
    }

    /// Takes requests again after [`pause`](Self::pause): starts readers up to the
    /// configured count (a reader still finishing its request counts once it reads
    /// again). Resuming a queue that is not paused does nothing.
    pub fn resume(self: &Rc<Self>, co: &Co<'_>) -> io::Result<()> {
        if self.stopping.get() || !self.paused.replace(false) {
            return Ok(());
        }
        if let Some(since) = self.paused_since.take() {
            self.stats.borrow_mut().paused_ms += since.elapsed().as_millis() as u64;
        }
        for _ in self.live_readers.get()..self.config.readers.max(1) {
            self.spawn_reader(co)?;
        }
        Ok(())
    }

    /// Also counts every request read into `counter` (only this queue writes it), for
    /// the loop placement to read from another thread: the shallow client's
    /// [`SHALLOW_WEIGHT`](crate::read_ahead::SHALLOW_WEIGHT) times ([`ReadAhead::weigh`]).
    pub fn count_into(&self, counter: Arc<AtomicU64>) {
        *self.counted.borrow_mut() = Some(counter);
    }

    fn cancel_waits(&self, co: &Co<'_>) {
        let readers = std::mem::take(&mut *self.readers.borrow_mut());
        cancel_polls(co, &readers);
    }

    /// Suspends until the queue has no reader and no request left.
    pub fn wait_finished(&self, co: &Co<'_>) {
        while !self.is_finished() {
            self.finished.wait(co);
        }
    }

    /// Why the request stream failed (a read error other than the unmount, or a read too
    /// short to hold a request header), if it did: the queue stopped then, and the caller
    /// should unmount and exit with an error.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Records that the stream is unusable, and stops the queue (the other readers'
    /// waits are cancelled; requests in flight finish).
    fn fail(&self, co: &Co<'_>, e: &io::Error) {
        log::error!("reading /dev/fuse: {e}; the request stream is unusable, this queue stops");
        self.stats.borrow_mut().stream_errors += 1;
        self.failure
            .borrow_mut()
            .get_or_insert_with(|| format!("reading /dev/fuse: {e}"));
        self.stop(co);
    }

    /// Whether the queue has no reader and no request left (after a stop, or unmounted;
    /// never while paused).
    pub fn is_finished(&self) -> bool {
        let resting = self.paused.get() && !self.stopping.get();
        !resting && self.live_readers.get() == 0 && self.in_flight.get() == 0
    }

    /// What the queue did so far.
    pub fn stats(&self) -> QueueStats {
        let mut stats = *self.stats.borrow();
        stats.buffers_allocated = self.buffers.requests.allocated();
        stats
    }

    /// The per-opcode accounting so far (empty unless `QueueConfig::account`).
    pub fn accounting(&self) -> BTreeMap<String, OpReport> {
        self.accounting.borrow().report()
    }

    /// A copy of the accounting so far, to merge with other queues' (allocates: for
    /// snapshots, not per request).
    pub fn accounting_copy(&self) -> Accounting {
        let mut copy = Accounting::default();
        copy.merge(&self.accounting.borrow());
        copy
    }

    /// Starts timing a request whose read just completed, if accounting is on.
    fn clock(&self, co: &Co<'_>, buf: &RequestBuf, n: usize) -> Option<RequestClock> {
        let opcode = header_of(buf.request(n))?.opcode;
        self.config.account.then(|| RequestClock::start(co, opcode))
    }

    fn account(&self, co: &Co<'_>, clock: Option<RequestClock>, served: &Served) {
        if let Some(clock) = clock {
            let direct = !self.config.ring_replies || self.config.inline;
            // The read(2) that brought the request, and a reply written directly.
            let syscalls = 1 + u32::from(direct && matches!(served, Served::Replied(_)));
            let sample = clock.finish(co, syscalls);
            self.accounting.borrow_mut().record(&sample);
        }
    }

    fn spawn_reader(self: &Rc<Self>, co: &Co<'_>) -> io::Result<()> {
        let queue = Rc::clone(self);
        // It first runs after this coroutine suspends: counting it afterwards is in time.
        let id = co.spawn_named("fuse-request", move |co| queue.reader(co))?;
        self.add_reader(id);
        Ok(())
    }

    /// Counts coroutine `id` among the readers (for `is_finished`, and `stop`'s cancels).
    fn add_reader(&self, id: TaskId) {
        self.live_readers.set(self.live_readers.get() + 1);
        self.readers.borrow_mut().push(id);
    }

    /// Serves the request of `n` bytes in `buf` with `cx`, replying on `dev` (the fd it
    /// came from), and accounts for it.
    fn serve(&self, co: &Co<'_>, cx: &Ctx<'_>, dev: &FuseDev, buf: &mut RequestBuf, n: usize) {
        let clock = self.clock(co, buf, n);
        let (request, data) = buf.parts(n);
        let served = self.dispatch(co, cx, dev, request, data);
        self.account(co, clock, &served);
    }

    /// How to serve a request that came to the reader so, and where its reply goes: with
    /// blocking calls on the loop's thread if it was waited for while the loop had
    /// nothing else to do (never one found queued: at iodepth 64 that would keep a loop
    /// serving one request at a time), nor one of a file system whose requests may stall
    /// ([`FileSystem::waits_are_bounded`]), nor a lock request that waits for another
    /// process (SETLKW); else in this coroutine.
    fn how_to_serve<'c>(
        &'c self,
        co: &'c Co<'c>,
        came: Came,
        request: &[u8],
    ) -> (Ctx<'c>, &'c FuseDev) {
        // Looked at only for a request the loop waited for, not on a deep client's path.
        let bounded = || waits_are_bounded(self.bounded, request);
        match came {
            Came::Blocked => {
                let dev = self.blocking.as_ref().expect("blocking clone");
                match bounded() {
                    true => (Ctx::Blocking, dev),
                    false => (Ctx::Coroutine(co), dev),
                }
            }
            Came::Waited if self.may_block() && co.loop_is_alone() && bounded() => {
                (Ctx::Blocking, &self.dev)
            }
            _ => (Ctx::Coroutine(co), &self.dev),
        }
    }

    /// A reader's life: take a request ([`Queue::next_request`]) and serve it; if serving
    /// suspends, hand reading over to a new reader first and end after this request,
    /// otherwise take the next one. In `inline` mode the one reader serves every request
    /// itself, without suspending.
    fn reader(self: Rc<Self>, co: &Co<'_>) {
        if self.config.inline {
            return self.inline_reader(co);
        }
        // Requests already taken are served whatever happens to the queue meanwhile.
        let hand_over = |co: &Co<'_>| {
            if self.not_taking().is_none() || !self.backlog.borrow().is_empty() {
                if let Err(e) = self.spawn_reader(co) {
                    log::error!("cannot start a /dev/fuse reader: {e}");
                }
            }
            self.replenish_readers(co);
        };
        loop {
            let next = self.next_request(co);
            self.readers.borrow_mut().retain(|&id| id != co.id());
            self.live_readers.set(self.live_readers.get() - 1);
            match next {
                Ok(Next::Request(mut buf, n, came)) => {
                    let (cx, dev) = self.how_to_serve(co, came, buf.request(n));
                    // Timed: what the loop waited for (so its speed decides how it waits).
                    let timed = self.blocking.is_some() && came != Came::Queued;
                    let started = timed.then(Instant::now);
                    self.in_flight.set(self.in_flight.get() + 1);
                    let ((), handed_over) =
                        co.on_first_suspend(&hand_over, || self.serve(co, &cx, dev, &mut buf, n));
                    if let Some(started) = started {
                        self.waited_for(started.elapsed(), matches!(cx, Ctx::Blocking));
                    }
                    self.in_flight.set(self.in_flight.get() - 1);
                    self.buffers.requests.give(buf);
                    let done = self.not_taking().is_some() && self.backlog.borrow().is_empty();
                    if handed_over && !done {
                        self.wake_waiters_to_block(co);
                    }
                    if handed_over || done {
                        break;
                    }
                    self.stats.borrow_mut().served_in_place += 1;
                    self.add_reader(co.id());
                    self.replenish_readers(co);
                }
                Ok(Next::Paused | Next::Surplus) => break,
                Ok(Next::Ended) => {
                    self.stopping.set(true);
                    break;
                }
                Err(e) => {
                    // The queue stops; what the backlog holds is still served.
                    self.fail(co, &e);
                    self.add_reader(co.id());
                }
            }
        }
        if self.is_finished() {
            self.float(false); // the loop may serve other sessions
            self.finished.wake_all(co);
        }
    }

    fn inline_reader(self: Rc<Self>, co: &Co<'_>) {
        let mut buf = self.buffers.requests.take();
        loop {
            match self.receive(co, &mut buf) {
                Ok(Got::Request(n)) => {
                    self.serve(co, &Ctx::Blocking, &self.dev, &mut buf, n);
                }
                // One reader that serves inline is never paused (the placement runs only
                // with coroutine dispatch); should it be, it ends like a stop.
                Ok(Got::Paused | Got::Ended) => break,
                Err(e) => {
                    self.fail(co, &e);
                    break;
                }
            }
        }
        self.stopping.set(true);
        self.readers.borrow_mut().clear();
        self.live_readers.set(self.live_readers.get() - 1);
        self.buffers.requests.give(buf);
        self.finished.wake_all(co);
    }

    /// Why a reader takes no request now, if it does not: ended (the queue stops, or
    /// the file system is gone) or paused.
    fn not_taking(&self) -> Option<Got> {
        if self.stopping.get() {
            Some(Got::Ended)
        } else if self.paused.get() {
            Some(Got::Paused)
        } else {
            None
        }
    }

    /// Reads one request into `buf` with `read(2)`, which never blocks (O_NONBLOCK) and
    /// cannot be cancelled: a request it takes is served even if the queue pauses or
    /// stops meanwhile.
    fn read_one(&self, buf: &mut RequestBuf) -> io::Result<Read> {
        let result = Ctx::Blocking.read(&self.dev, buf.read_area());
        let read = self.take_read(result, buf);
        self.watch_for_a_pile(&read);
        read
    }

    /// What a read of /dev/fuse into `buf` returned, counted.
    fn take_read(&self, result: io::Result<usize>, buf: &mut RequestBuf) -> io::Result<Read> {
        let again = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EAGAIN));
        Ok(match classify_read(result)? {
            Received::Request(n) => {
                self.stats.borrow_mut().requests += 1;
                self.streak.set(self.streak.get() + 1);
                let n = whole_request(n)?;
                let weight = self.read_ahead.weigh(buf.request(n));
                if let Some(counter) = &*self.counted.borrow() {
                    // One writer: a plain store, no locked add.
                    counter.store(counter.load(Ordering::Relaxed) + weight, Ordering::Relaxed);
                }
                Read::Request(n)
            }
            Received::Unmounted => Read::Unmounted,
            Received::Retry if again => {
                self.stats.borrow_mut().empty_reads += 1;
                self.streak.set(0);
                Read::Empty
            }
            Received::Retry => Read::Interrupted,
        })
    }

    /// After [`STREAK`] requests read back to back, suspends once on a NOP, so that the
    /// loop reaps completions: a reader that always finds a request queued (and serves it
    /// without suspending: inline, or from the page cache) would otherwise keep the loop
    /// from seeing its control eventfd, and a stop at SIGTERM would wait for a gap in the
    /// clients' requests (64 writers on a slow machine: more than 5 s). Whether it
    /// suspended.
    fn let_the_loop_in(&self, co: &Co<'_>) -> io::Result<bool> {
        if self.streak.get() < STREAK {
            return Ok(false);
        }
        self.streak.set(0);
        co.ctx().nop()?;
        Ok(true)
    }

    /// Waits until /dev/fuse has a request; false if the wait was cancelled (a stop or a
    /// pause).
    fn wait_readable(&self, co: &Co<'_>) -> io::Result<bool> {
        self.float(false);
        self.waiting.set(self.waiting.get() + 1);
        let polled = co.ctx().poll(&self.dev, libc::POLLIN);
        self.waiting.set(self.waiting.get() - 1);
        match polled {
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => Ok(false),
            Err(e) => Err(e),
            Ok(_) => Ok(true),
        }
    }

    /// Reads one request, unless the queue stops, pauses or the file system is unmounted
    /// (for the `inline` reader, which keeps no backlog).
    fn receive(&self, co: &Co<'_>, buf: &mut RequestBuf) -> io::Result<Got> {
        loop {
            if let Some(why) = self.not_taking() {
                return Ok(why);
            }
            if self.let_the_loop_in(co)? {
                continue; // a stop or pause may have come meanwhile
            }
            match self.read_one(buf)? {
                Read::Request(n) => return Ok(Got::Request(n)),
                Read::Unmounted => return Ok(Got::Ended),
                Read::Interrupted => {}
                // `stop` or `pause` may have run while this reader was ready to resume,
                // when there was no I/O of ours to cancel: `not_taking` looks again first.
                Read::Empty => {
                    if self.not_taking().is_none() && !self.wait_readable(co)? {
                        return Ok(self.not_taking().unwrap_or(Got::Ended));
                    }
                }
            }
        }
    }

    /// The next request for a coroutine reader to serve: from the backlog while it holds
    /// some (even when the queue pauses or stops), else from /dev/fuse. A request read
    /// right after another was served means the kernel may hold a queue of them: then, if
    /// a drain is due ([`ReadAhead::starts_drain`]), the reader takes what it holds into
    /// the backlog and starts them by turns ([`crate::backlog`]). A request read after
    /// waiting (the queue was idle) is served at once, with no read more.
    fn next_request(&self, co: &Co<'_>) -> io::Result<Next> {
        let mut after_wait = false;
        loop {
            if !self.backlog.borrow().is_empty() {
                if self.not_taking().is_none() && self.read_ahead.due() {
                    self.drain()?;
                }
                let (buf, n) = self.backlog.borrow_mut().pop().expect("not empty");
                return Ok(Next::Request(buf, n, Came::Queued));
            }
            if let Some(why) = self.not_taking() {
                return Ok(match why {
                    Got::Paused => Next::Paused,
                    _ => Next::Ended,
                });
            }
            if self.let_the_loop_in(co)? {
                continue; // a stop or pause may have come meanwhile
            }
            let mut buf = self.buffers.requests.take();
            let read = self.read_one(&mut buf);
            match read {
                Ok(Read::Request(n)) if after_wait => {
                    return Ok(Next::Request(buf, n, Came::Waited))
                }
                Ok(Read::Request(n)) if !self.read_ahead.starts_drain(buf.request(n)) => {
                    return Ok(Next::Request(buf, n, Came::Queued));
                }
                Ok(Read::Request(n)) => {
                    self.backlog
                        .borrow_mut()
                        .push(Turn::of(buf.request(n)), (buf, n));
                    self.drain()?;
                    continue;
                }
                _ => self.buffers.requests.give(buf),
            }
            match read? {
                Read::Request(_) => unreachable!("served above"),
                Read::Unmounted => self.stopping.set(true),
                Read::Interrupted => {}
                // `stop` or `pause` may have run while this reader was ready to resume,
                // when there was no I/O of ours to cancel: look again before waiting.
                Read::Empty => {
                    if self.not_taking().is_some() {
                        continue;
                    }
                    if self.may_block() {
                        let waiting = self.waiting.get();
                        if waiting == 0 {
                            if let Some(next) = self.block_for_request(co)? {
                                return Ok(next);
                            }
                        } else if co.loop_is_alone_but(waiting) {
                            // Nothing else to do but the other waiters' polls: one waiter is
                            // enough, and the loop then comes to block (with I/O in flight,
                            // readers are kept as without `block_when_idle`).
                            return Ok(Next::Surplus);
                        }
                    }
                    after_wait = self.wait_readable(co)?;
                }
            }
        }
    }

    /// After a request that suspended (its reader handed reading over): if the loop now
    /// has nothing to do but the new readers' polls and may block, ends those polls, so
    /// that a reader looks again and waits in a blocking read. The reader that took over
    /// started its poll while this request still had I/O in flight, when the loop could
    /// not block; without this, a client whose every request suspends (a slow disk read
    /// at iodepth 1) would be waited for on the ring for good (CI, 2026-12-07: 1 of 204
    /// such requests served blocking).
    fn wake_waiters_to_block(&self, co: &Co<'_>) {
        let waiting = self.waiting.get();
        if waiting > 0 && self.may_block() && co.loop_is_alone_but(waiting) {
            // The readers stay listed (a stop still finds them): only their polls end.
            // (`cancel_io` queues a cancellation and returns: no switch while borrowed.)
            cancel_polls(co, &self.readers.borrow());
        }
    }

    /// Books a request the loop waited for, served in `took` (with blocking calls or not).
    fn waited_for(&self, took: Duration, blocking: bool) {
        let ns = took.as_nanos().min(u128::from(u32::MAX)) as u64;
        let average = self.waited_service_ns.get();
        self.waited_service_ns.set(average - average / 8 + ns / 8);
        if blocking {
            self.stats.borrow_mut().served_blocking += 1;
            if took > SLOW_SERVICE {
                self.queued_after_slow.set(1);
            }
        }
    }

    /// After a request served slowly with blocking calls, looks at what the reads find:
    /// two requests in a row found queued start a [`DEEP_HOLD`], nothing ends the watch.
    fn watch_for_a_pile(&self, read: &io::Result<Read>) {
        let watch = self.queued_after_slow.get();
        if watch == 0 {
            return;
        }
        match read {
            Ok(Read::Request(_)) if watch >= 2 => {
                self.queued_after_slow.set(0);
                self.deep_until.set(Some(Instant::now() + DEEP_HOLD));
                self.stats.borrow_mut().deep_holds += 1;
            }
            Ok(Read::Request(_)) => self.queued_after_slow.set(watch + 1),
            _ => self.queued_after_slow.set(0),
        }
    }

    /// While the loop may not block (a deep client lately), starts readers up to the
    /// configured count again: those that ended as surplus while it could
    /// ([`Next::Surplus`]) would otherwise leave it one reader under a deep client.
    fn replenish_readers(self: &Rc<Self>, co: &Co<'_>) {
        if self.blocking.is_none() || self.may_block() || self.not_taking().is_some() {
            return;
        }
        while self.live_readers.get() < self.config.readers.max(1) {
            if let Err(e) = self.spawn_reader(co) {
                log::error!("cannot start a /dev/fuse reader: {e}");
                return;
            }
        }
    }

    /// Lets the loop thread run on every CPU of the process while it waits in blocking
    /// reads (`wide`), and pins it home again when it waits on its ring. Pinned, the one
    /// loop that blocks may sit on the CPU away from the client or the disk's interrupts,
    /// and two blocked loops are woken by turns: fio, ext4 `--direct` psync qd1, 5
    /// interleaved rounds, floating 12.7-13.8k against pinned 10.1-14.0k and `threads:2`
    /// 12.5-14.8k (benches/HISTORY.md); at iodepth 64 the loop waits on its ring, pinned.
    fn float(&self, wide: bool) {
        let Some((home, process)) = &self.float else {
            return;
        };
        if self.floating.get() == wide {
            return;
        }
        let set = if wide { process } else { home };
        match set.apply(0) {
            Ok(()) => self.floating.set(wide),
            Err(e) => log::debug!("loop affinity to {set:?}: {e}"),
        }
    }

    /// Whether the loop may wait for a request in a blocking read, and serve what it waited
    /// for with blocking calls: `block_when_idle`, the requests it waits for are slow, and
    /// no deep client seen lately.
    fn may_block(&self) -> bool {
        self.blocking.is_some()
            && self.waited_service_ns.get() > SLOW_SERVICE.as_nanos() as u64
            && match self.deep_until.get() {
                None => true,
                Some(until) if Instant::now() >= until => {
                    self.deep_until.set(None);
                    true
                }
                Some(_) => false,
            }
    }

    /// Waits for a request in a blocking `read(2)` of the blocking clone, if the loop has
    /// nothing else to do ([`Co::block_while_idle`]; a wake-up of the loop ends it). `None`
    /// if it did not block or was woken without a request: wait through the ring then.
    fn block_for_request(&self, co: &Co<'_>) -> io::Result<Option<Next>> {
        let blocking = self.blocking.as_ref().expect("blocking clone");
        self.float(true);
        let mut buf = self.buffers.requests.take();
        let Some(result) = co.block_while_idle(|| Ctx::Blocking.read(blocking, buf.read_area()))
        else {
            self.buffers.requests.give(buf);
            return Ok(None);
        };
        self.stats.borrow_mut().blocked_reads += 1;
        self.queued_after_slow.set(0); // the loop was idle: no pile
        match self.take_read(result, &mut buf) {
            Ok(Read::Request(n)) => Ok(Some(Next::Request(buf, n, Came::Blocked))),
            other => {
                self.buffers.requests.give(buf);
                if let Read::Unmounted = other? {
                    self.stopping.set(true);
                }
                Ok(None)
            }
        }
    }

    /// Shares the shallow client with the session's other loops
    /// ([`crate::placement::Placement::shallow_client`]).
    pub fn share_shallow_client(&self, handle: Arc<AtomicU64>) {
        self.read_ahead.share(handle);
    }

    /// Shares the thread id of the shallow client's requests with the loop placement
    /// ([`crate::placement::Placement::shallow_pid`]).
    pub fn share_shallow_pid(&self, pid: Arc<AtomicU32>) {
        self.read_ahead.share_pid(pid);
    }

    /// Takes the requests /dev/fuse holds into the backlog, as many as [`ReadAhead::start`]
    /// allows and up to [`DRAIN_BYTES`]. An unmount or an interrupted read just ends it
    /// (the next read sees it again).
    fn drain(&self) -> io::Result<()> {
        let limit = self.read_ahead.start();
        let mut bytes = 0;
        let mut ended = Ok(());
        while self.backlog.borrow().len() < limit && bytes < DRAIN_BYTES {
            let mut buf = self.buffers.requests.take();
            match self.read_one(&mut buf) {
                Ok(Read::Request(n)) => {
                    bytes += bytes_moved(buf.request(n));
                    self.stats.borrow_mut().backlogged += 1;
                    self.backlog
                        .borrow_mut()
                        .push(Turn::of(buf.request(n)), (buf, n));
                }
                other => {
                    self.buffers.requests.give(buf);
                    ended = other.map(|_| ());
                    break;
                }
            }
        }
        self.read_ahead.judge(&self.backlog.borrow());
        ended
    }

    /// Runs one request with `cx` and replies (through the ring or with `writev(2)`).
    fn dispatch(
        &self,
        co: &Co<'_>,
        cx: &Ctx<'_>,
        dev: &FuseDev,
        request: &[u8],
        data: &mut [u8],
    ) -> Served {
        let served = serve_request(&*self.fs, cx, request, &[], data, |reply| {
            let slices = reply.io_slices();
            if self.config.ring_replies && !self.config.inline && matches!(cx, Ctx::Coroutine(_)) {
                co.ctx().writev(dev, &slices)
            } else {
                dev.writev(&slices)
            }
        });
        self.stats.borrow_mut().record(&served);
        served
    }
}

/// Whether serving `request` can only wait for a bounded time, so that a loop may serve
/// it with blocking calls: its file system's waits are bounded
/// ([`FileSystem::waits_are_bounded`]) and it is not a lock request that waits for
/// another process to unlock (SETLKW: served blocking on the only loop, it would keep
/// the unlock from being served).
fn waits_are_bounded(fs_bounded: bool, request: &[u8]) -> bool {
    fs_bounded && header_of(request).is_some_and(|h| h.opcode != FUSE_SETLKW)
}

/// Cancels the polls of `readers` on /dev/fuse (each reader wakes with ECANCELED and
/// decides itself whether to read again, block or end).
fn cancel_polls(co: &Co<'_>, readers: &[TaskId]) {
    for &id in readers {
        if let Err(e) = co.cancel_io(id) {
            log::warn!("cancelling a wait on /dev/fuse: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuse::abi::{fuse_in_header, FUSE_READ, FUSE_SETLK};

    fn request(opcode: u32) -> Vec<u8> {
        let mut request = vec![0u8; std::mem::size_of::<fuse_in_header>() + 64];
        let len = request.len() as u32;
        request[0..4].copy_from_slice(&len.to_ne_bytes());
        request[4..8].copy_from_slice(&opcode.to_ne_bytes());
        request
    }

    #[test]
    fn a_lock_wait_is_never_served_blocking() {
        assert!(waits_are_bounded(true, &request(FUSE_READ)));
        assert!(
            waits_are_bounded(true, &request(FUSE_SETLK)),
            "SETLK does not wait"
        );
        assert!(!waits_are_bounded(true, &request(FUSE_SETLKW)));
        assert!(
            !waits_are_bounded(false, &request(FUSE_READ)),
            "a file system that may stall"
        );
        assert!(!waits_are_bounded(true, &[0u8; 8]), "no header");
    }
}
