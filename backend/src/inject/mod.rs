//! Fault injection (`corofuse mount --inject SPEC`): [`InjectBackend`] wraps any backend
//! and fails or delays the operations its rules match, in the manner of QEMU's `blkdebug`.
//!
//! Why a wrapper: error paths are the code least run and most often wrong, in the daemon
//! (an error must reach the client as exactly that errno, and every other request must
//! go on being served) and in what runs on top (a guest, `qemu-img`, a file system on the
//! export). Real disks fail rarely and never on cue; a rule fails the operation you name,
//! at the offset you name, every run. Being a [`BlockBackend`] around another, it works
//! with every backend (null, file buffered or O_DIRECT) and in every dispatch mode.
//!
//! # Semantics
//! - Rules ([`spec`] has the grammar) are tried in order for each operation. A rule
//!   *matches* an operation of its kind (`any`: every kind) that overlaps its byte range,
//!   if it has one (flush has no range, so `any@RANGE` never matches a flush; a resize
//!   covers the bytes between the old and the new size). A matching rule *fires* as its
//!   condition says; `once` and `nth=N` count the operations the rule matched.
//! - A fault fires: the operation fails with the rule's errno and is not run (nothing is
//!   written, read or zeroed), and the rules after it are not tried. A delay fires: the
//!   operation waits, then the next rules are tried; a delay never holds up the event loop
//!   in coroutine mode (an `IORING_OP_TIMEOUT`), while blocking modes sleep the thread.
//! - `after=SIZE` lets through at most SIZE bytes of matching operations that succeed;
//!   each one that would go past that fires (a later smaller one may still fit, as on a
//!   nearly full disk). Bytes are reserved before the operation runs and given back if it
//!   fails, so concurrent operations never overshoot.
//! - `N/M` draws from a generator seeded by `seed=N` and the rule's position, keyed by the
//!   rule's count of matched operations: the same sequence of operations fails the same
//!   way every run.
//! - Rules apply to every call of the backend, the export's final flush at exit included:
//!   a `flush:EIO` rule that fires then makes the daemon exit with an error, as a real
//!   failing disk would.
//! - [`InjectBackend::inject_stats`] counts what fired, per operation and errno; each fault
//!   is logged at debug level.

pub mod error;
pub mod spec;

use std::collections::BTreeMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::{iov, BackendStats, BlockBackend, Ctx, Extent};
pub use error::{RuleError, SpecError};
pub use spec::{errno_name, parse, Action, Op, Range, Rule, Spec, When};

/// Most rules a spec may have (reservations are a bit mask per operation).
pub const MAX_RULES: usize = 64;

/// A backend that fails or delays what its rules match, and passes the rest through.
pub struct InjectBackend {
    inner: Arc<dyn BlockBackend>,
    spec: Spec,
    rules: Vec<Armed>,
}

/// One rule and its counters.
struct Armed {
    rule: Rule,
    /// Operations matched so far (the count `nth=` and `N/M` go by).
    matched: AtomicU64,
    /// Bytes reserved or succeeded, for `after=`.
    used: AtomicU64,
    /// Times fired, per [`Op::index`].
    fired: [AtomicU64; 6],
    /// Total delay slept, in nanoseconds.
    slept_ns: AtomicU64,
}

/// One backend call, as the rules see it.
#[derive(Clone, Copy, Debug)]
struct Io {
    op: Op,
    offset: u64,
    len: u64,
}

/// `after=` reservations an admitted operation holds: a bit per rule.
#[must_use]
struct Ticket(u64);

enum Fire {
    No,
    Yes,
    /// An `after=` rule let it through and holds its bytes.
    Reserved,
}

impl InjectBackend {
    /// Wraps `inner` with the rules of `spec` (see [`parse`]).
    ///
    /// # Panics
    /// With more than [`MAX_RULES`] rules ([`parse`] refuses those).
    pub fn new(inner: Arc<dyn BlockBackend>, spec: Spec) -> InjectBackend {
        assert!(spec.rules.len() <= MAX_RULES, "at most {MAX_RULES} rules");
        let rules = spec.rules.iter().cloned().map(Armed::new).collect();
        InjectBackend { inner, spec, rules }
    }

    /// Tries the rules on `io`: sleeps for the delays that fire, fails with the first
    /// fault that fires, else admits it.
    fn admit(&self, cx: &Ctx<'_>, io: Io) -> io::Result<Ticket> {
        let mut ticket = Ticket(0);
        for (i, armed) in self.rules.iter().enumerate() {
            if !armed.matches(io) {
                continue;
            }
            let key = self.spec.seed ^ ((i as u64) << 48);
            match armed.fires(key, io) {
                Fire::No => continue,
                Fire::Reserved => ticket.0 |= 1 << i,
                Fire::Yes => match armed.rule.action {
                    Action::Delay(d) => armed.delay(cx, io, d),
                    Action::Fail(errno) => {
                        armed.fired[io.op.index()].fetch_add(1, Relaxed);
                        self.settle(ticket, io.len);
                        log::debug!(
                            "inject: {io} fails with {} (rule \"{}\")",
                            errno_name(errno),
                            armed.rule.text
                        );
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                },
            }
        }
        Ok(ticket)
    }

    /// Gives back `unused` bytes of each `after=` reservation `ticket` holds.
    fn settle(&self, ticket: Ticket, unused: u64) {
        if unused == 0 {
            return;
        }
        for (i, armed) in self.rules.iter().enumerate() {
            if ticket.0 & (1 << i) != 0 {
                armed.used.fetch_sub(unused, Relaxed);
            }
        }
    }

    /// Runs `f` as `io` if the rules admit it; `done` says how many bytes it moved.
    fn run<T>(
        &self,
        cx: &Ctx<'_>,
        io: Io,
        f: impl FnOnce() -> io::Result<T>,
        done: impl FnOnce(&T) -> u64,
    ) -> io::Result<T> {
        let ticket = self.admit(cx, io)?;
        let result = f();
        let moved = result.as_ref().map_or(0, done).min(io.len);
        self.settle(ticket, io.len - moved);
        result
    }

    /// As [`run`](Self::run), for an operation that moves all of `io.len` or fails.
    fn run_all(&self, cx: &Ctx<'_>, io: Io, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        self.run(cx, io, f, |()| io.len)
    }

    /// What fired so far.
    pub fn counts(&self) -> InjectStats {
        let mut stats = InjectStats {
            spec: self.spec.to_string(),
            seed: self.spec.seed,
            ..InjectStats::default()
        };
        for armed in &self.rules {
            stats.add(armed);
        }
        stats
    }
}

impl Armed {
    fn new(rule: Rule) -> Armed {
        Armed {
            rule,
            matched: AtomicU64::new(0),
            used: AtomicU64::new(0),
            fired: Default::default(),
            slept_ns: AtomicU64::new(0),
        }
    }

    fn matches(&self, io: Io) -> bool {
        if self.rule.op.is_some_and(|op| op != io.op) {
            return false;
        }
        match self.rule.range {
            None => true,
            Some(_) if io.op == Op::Flush => false,
            // An empty operation counts as the byte at its offset.
            Some((start, end)) => {
                io.offset < end && start < io.offset.saturating_add(io.len.max(1))
            }
        }
    }

    /// Counts a matched operation and decides; `key` (the seed mixed with the rule's
    /// position) and the count make the draw of an `N/M` rule.
    fn fires(&self, key: u64, io: Io) -> Fire {
        let n = self.matched.fetch_add(1, Relaxed) + 1;
        let yes = match self.rule.when {
            When::Always => true,
            When::Nth(nth) => n == nth,
            When::Chance { num, den } => splitmix64(key ^ n) % den < num,
            When::After(size) => {
                let reserve = |used: u64| used.checked_add(io.len).filter(|&u| u <= size);
                return match self.used.fetch_update(Relaxed, Relaxed, reserve) {
                    Ok(_) => Fire::Reserved,
                    Err(_) => Fire::Yes,
                };
            }
        };
        if yes {
            Fire::Yes
        } else {
            Fire::No
        }
    }

    fn delay(&self, cx: &Ctx<'_>, io: Io, d: Duration) {
        self.fired[io.op.index()].fetch_add(1, Relaxed);
        self.slept_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        log::debug!("inject: {io} delayed {d:?} (rule \"{}\")", self.rule.text);
        if let Err(e) = cx.sleep(d) {
            // Only at shutdown (the ring refuses new work): run the operation at once.
            log::debug!("inject: delay cut short: {e}");
        }
    }
}

impl std::fmt::Display for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.op {
            Op::Flush => f.write_str("flush"),
            Op::Resize => write!(f, "resize across [{}, +{})", self.offset, self.len),
            op => write!(f, "{} at {}+{}", op.name(), self.offset, self.len),
        }
    }
}

/// splitmix64: a small, good mixer, so that draws are reproducible from the seed.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn io(op: Op, offset: u64, len: u64) -> Io {
    Io { op, offset, len }
}

impl BlockBackend for InjectBackend {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn readv(&self, cx: &Ctx<'_>, bufs: &mut [IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
        let read = io(Op::Read, offset, iov::total(bufs) as u64);
        self.run(
            cx,
            read,
            || self.inner.readv(cx, bufs, offset),
            |&n| n as u64,
        )
    }

    fn writev(&self, cx: &Ctx<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<()> {
        let write = io(Op::Write, offset, iov::total(bufs) as u64);
        self.run_all(cx, write, || self.inner.writev(cx, bufs, offset))
    }

    fn flush(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.run_all(cx, io(Op::Flush, 0, 0), || self.inner.flush(cx))
    }

    /// A `flush` rule matches the close too (its flush at exit).
    fn close(&self, cx: &Ctx<'_>) -> io::Result<()> {
        self.run_all(cx, io(Op::Flush, 0, 0), || self.inner.close(cx))
    }

    fn discard(&self, cx: &Ctx<'_>, offset: u64, len: u64) -> io::Result<()> {
        let discard = io(Op::Discard, offset, len);
        self.run_all(cx, discard, || self.inner.discard(cx, offset, len))
    }

    fn write_zeroes(&self, cx: &Ctx<'_>, offset: u64, len: u64, may_unmap: bool) -> io::Result<()> {
        let op = if may_unmap { Op::Discard } else { Op::Zeroes };
        self.run_all(cx, io(op, offset, len), || {
            self.inner.write_zeroes(cx, offset, len, may_unmap)
        })
    }

    fn resize(&self, cx: &Ctx<'_>, new_len: u64) -> io::Result<()> {
        let old = self.inner.len();
        let changed = io(Op::Resize, old.min(new_len), old.abs_diff(new_len));
        self.run_all(cx, changed, || self.inner.resize(cx, new_len))
    }

    fn block_status(&self, cx: &Ctx<'_>, offset: u64) -> io::Result<Extent> {
        self.inner.block_status(cx, offset)
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        self.inner.allocated_bytes()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn describe(&self) -> String {
        format!("{}, injecting {}", self.inner.describe(), self.spec)
    }

    fn stats(&self) -> BackendStats {
        self.inner.stats()
    }

    fn open_warning(&self) -> Option<String> {
        self.inner.open_warning()
    }

    fn inject_stats(&self) -> Option<InjectStats> {
        Some(self.counts())
    }

    fn abort(&self) {
        self.inner.abort();
    }

    /// The backend's: an injected delay is bounded (it is how long it says).
    fn waits_are_bounded(&self) -> bool {
        self.inner.waits_are_bounded()
    }
}

/// What the rules did, for `--stats` (its `inject` section).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InjectStats {
    /// The rules, as given (plus the seed if a rule draws from it).
    pub spec: String,
    /// The seed of the `N/M` rules.
    pub seed: u64,
    /// Operations failed by a rule.
    pub faults: u64,
    /// Faults per operation, then per errno name: `{"write": {"ENOSPC": 3}}`.
    pub faults_by_op: BTreeMap<String, BTreeMap<String, u64>>,
    /// Delays slept (an operation may sleep for several rules).
    pub delays: u64,
    /// Delays per operation.
    pub delays_by_op: BTreeMap<String, u64>,
    /// Total time slept for delays, in microseconds.
    pub delayed_us: u64,
    /// Each rule in order: what it matched and how often it fired.
    pub rules: Vec<RuleStats>,
}

/// One rule's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuleStats {
    /// The rule as given.
    pub rule: String,
    /// Operations it matched (that reached it: an earlier fault stops the others).
    pub matched: u64,
    /// Times it fired (a fault or a delay).
    pub fired: u64,
}

impl InjectStats {
    fn add(&mut self, armed: &Armed) {
        let mut fired = 0;
        for op in Op::ALL {
            let n = armed.fired[op.index()].load(Relaxed);
            fired += n;
            if n == 0 {
                continue;
            }
            match armed.rule.action {
                Action::Fail(errno) => {
                    self.faults += n;
                    let by_errno = self.faults_by_op.entry(op.name().to_string()).or_default();
                    *by_errno.entry(errno_name(errno)).or_default() += n;
                }
                Action::Delay(_) => {
                    self.delays += n;
                    *self.delays_by_op.entry(op.name().to_string()).or_default() += n;
                }
            }
        }
        self.delayed_us += armed.slept_ns.load(Relaxed) / 1000;
        self.rules.push(RuleStats {
            rule: armed.rule.text.clone(),
            matched: armed.matched.load(Relaxed),
            fired,
        });
    }
}
