//! The loop's fast paths, tuned (benches/HISTORY.md): each runs turns the general loop would
//! run, with less work.
//!
//! A coroutine that yields as the last of its turn, with nothing else ready and nothing in
//! flight, is resumed again at once (`run_alone`); one that parks on I/O with nothing else
//! ready is resumed in place when the next wait reaps its CQE alone (`wait_alone`): the
//! same turns, without the queue. With hundreds of coroutines queued, the loop prefetches
//! the stack top of the one 9 places behind the one it resumes (`prefetch_ahead`):
//! resuming a coroutine whose stack page is cold waits for its translation and its line
//! otherwise.
//!
//! They are apart from the turn itself (`executor`) so that it stays short to read, and the
//! conditions that send a coroutine back to the general loop are in one place.

use std::cell::Cell;
use std::io;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use corosensei::CoroutineResult;

use crate::executor::Inner;
use crate::resume::Back;
use crate::task::{Coro, Park};

/// Queue lengths from which the loop prefetches stacks ahead: below this, the coroutines'
/// stacks stay in the caches and translation buffers anyway.
const PREFETCH_FROM: usize = 256;
/// How many places behind the coroutine being resumed the loop prefetches.
const PREFETCH_AHEAD: usize = 9;

/// Hints the CPU to fetch the line at `address` (any address: a prefetch never faults).
#[inline(always)]
fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch has no architectural effect and does not fault, whatever the
    // address; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// How [`Inner::wait_alone`] handed back to the general loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alone {
    /// `stop()` held.
    Stopped,
    /// Completions were reaped (or `stop()` made a coroutine ready) and `stop()` was checked
    /// after the last turn: the next turn starts.
    Reaped,
    /// The coroutine ran a turn and left the fast path: the turn ends as any other.
    Ran,
}

impl Inner {
    /// Whether the coroutine that just parked on I/O is the only one the loop could run
    /// next: nothing else is ready (other SQEs may be in flight).
    #[inline(always)]
    pub(crate) fn waits_alone(&self) -> bool {
        self.sched.with(|s| s.ready.is_empty())
    }

    /// The fast path for a coroutine that parked on I/O with nothing else ready
    /// (`waits_alone`): the loop waits, and when the only CQE it reaps is that coroutine's,
    /// resumes it in place, without the run queue, for as long as this repeats. That is the
    /// turn the loop would have run. Each wait ends a turn: `stop` is checked before it.
    /// Any other CQE, yield or spawn sends it all back to the general loop, in CQE order;
    /// so does a `stop()` that makes another coroutine ready. Out of line: its loop then
    /// keeps to a small frame of its own (a NOP round trip touches two cache lines fewer
    /// than inside `run_until`).
    #[inline(never)]
    pub(crate) fn wait_alone(
        &self,
        key: usize,
        stop: &mut impl FnMut() -> bool,
    ) -> io::Result<Alone> {
        // Looked up once: the slot stays put while its coroutine lives.
        let slot = self.coros.with(|coros| coros.slot(key));
        loop {
            if stop() {
                return Ok(Alone::Stopped);
            }
            if !self.waits_alone() {
                return self.made_ready_by_stop();
            }
            self.wait()?;
            // The run queue is empty (checked above) and only this reap fills it, so
            // whether it is still empty is `got`, kept in a register, not reloaded. `lone`
            // is the key whose CQE would be the lone coroutine's alone so far: `key` until a
            // coroutine's CQE is reaped, then none (one compare per CQE).
            let mut got = Got::Nothing;
            let mut lone = key;
            let reaped = self.reactor.reap(&self.counters, |user_data, result| {
                let Some(ready) = self.completed(user_data) else {
                    return;
                };
                if ready == lone {
                    got = Got::Mine(result);
                    lone = NO_KEY;
                    return;
                }
                lone = NO_KEY;
                // Not alone after all: queue everything, in CQE order.
                self.sched.with(|s| {
                    if let Got::Mine(first) = got {
                        s.ready.push_back((key, first));
                    }
                    s.ready.push_back((ready, result));
                });
                got = Got::Queued;
            });
            self.reaped(reaped);
            let result = match got {
                Got::Mine(result) => result,
                Got::Nothing => continue, // woken without a coroutine's CQE (EINTR, a cancel's)
                Got::Queued => return Ok(Alone::Reaped),
            };
            match self.run_in_for_io(slot, key, result) {
                Back::Io if self.waits_alone() => continue,
                Back::Yielded => {
                    self.sched.with(|s| s.ready.push_back((key, 0)));
                    return Ok(Alone::Ran);
                }
                Back::Io | Back::Other => return Ok(Alone::Ran),
            }
        }
    }

    /// Whether the coroutine that just yielded is the only thing the loop has to do: no
    /// other coroutine is ready and no I/O is in flight (so no submit or reap is due).
    #[inline(always)]
    pub(crate) fn alone(&self) -> bool {
        // One sum of two counts, each at least zero: zero when both are (one test and
        // branch where the two tests took two).
        self.sched.with(|s| s.ready.len()) + self.reactor.in_flight() == 0
    }

    /// The fast path for one ready coroutine: it yielded as the last of its turn and is
    /// `alone`, so it is resumed again without the run queue. Each resume is a turn of its
    /// own: `stop` is checked before it, as after any turn, and the coroutine goes back to
    /// the queue as soon as anything else is ready or in flight (FIFO is kept). Returns
    /// whether `stop()` held.
    ///
    /// The coroutine's handle is moved out of its slot into this frame for as long as it
    /// only yields, and back before anything else is booked. In the slot, every resume
    /// reloaded the coroutine's saved stack pointer from memory that the switch before had
    /// just stored (the switch clobbers memory, and the slot's address is known to the
    /// rest of the loop): a store-to-load round trip on the switch's own dependency chain.
    /// A local whose address nothing else has stays in a register, as in raw corosensei.
    #[inline]
    pub(crate) fn run_alone(&self, key: usize, stop: &mut impl FnMut() -> bool) -> bool {
        // Looked up once: the slot stays put while its coroutine lives.
        let slot = self.coros.with(|coros| coros.slot(key));
        // SAFETY: the slot's address is stable (see `CoroStore`) and nothing touches the
        // slot of the running or yielding coroutine but the loop's own resume (this
        // function); `Held` puts the handle back before anything else can look at it, also
        // when `stop()` unwinds.
        let taken = unsafe { (*slot.as_ptr()).take() }.expect("a ready coroutine is in its slot");
        let mut held = Held {
            slot,
            co: ManuallyDrop::new(taken),
        };
        // Only the exits read the key: kept in memory (its address given away), it is read
        // there, where in a register the switch clobbers it was reloaded after every resume.
        let key = Cell::new(key);
        std::hint::black_box(&key);
        loop {
            if stop() {
                drop(held);
                self.sched.with(|s| s.ready.push_back((key.get(), 0)));
                return true;
            }
            self.counters.resumes.bump();
            // No value to hand over: a yield reads none (see `Coro`).
            match held.co.resume(()) {
                CoroutineResult::Yield(Park::Yield) => self.counters.suspends.bump(),
                other => {
                    drop(held);
                    self.came_back(key.get(), other);
                    return false;
                }
            }
            if !self.alone() {
                drop(held);
                self.sched.with(|s| s.ready.push_back((key.get(), 0)));
                return false;
            }
        }
    }

    /// With many coroutines queued, starts fetching the top of the stack of the one
    /// [`PREFETCH_AHEAD`] places behind the one being resumed (popped just before): its
    /// page's translation and its first line, which a resume of a cold coroutine otherwise
    /// waits for (benches/HISTORY.md, scaling).
    #[inline(always)]
    pub(crate) fn prefetch_ahead(&self) {
        self.sched.with(|s| {
            if s.ready.len() < PREFETCH_FROM {
                return;
            }
            // A start entry's key is stale but was some worker's (see `key_ahead`); `get`
            // costs what the bounds check did, and never panics on it.
            let ahead = s.ready.key_ahead(PREFETCH_AHEAD - 1);
            if let Some(&top) = ahead.and_then(|key| s.tops.get(key)) {
                prefetch(top.wrapping_sub(64));
            }
        });
    }

    /// [`Inner::wait_alone`] when `stop()` spawned or woke a coroutine: as the general loop
    /// would, submit and reap without waiting, and let the next turn run it.
    #[cold]
    #[inline(never)]
    fn made_ready_by_stop(&self) -> io::Result<Alone> {
        self.reactor.enter(0, &self.counters)?;
        self.reap();
        Ok(Alone::Reaped)
    }
}

/// Never a key (keys index the loop's slots), nor `INTERNAL`'s (reaped apart).
const NO_KEY: usize = usize::MAX - 1;

/// What the completions `wait_alone` reaped so far did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Got {
    /// Nothing for a coroutine (yet): the run queue is still empty.
    Nothing,
    /// Only the lone coroutine's CQE, with its result: nothing queued.
    Mine(i32),
    /// Other coroutines' CQEs: everything reaped is in the run queue, in CQE order.
    Queued,
}

/// A coroutine's handle taken out of its slot by `run_alone`; dropping it puts the handle
/// back, whether the fast path ends or `stop()` unwinds through it.
struct Held {
    slot: NonNull<Option<Coro>>,
    co: ManuallyDrop<Coro>,
}

impl Drop for Held {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `co` is taken once, here, and never used after; the slot is live and
        // empty since `run_alone` took the handle out of it.
        unsafe { *self.slot.as_ptr() = Some(ManuallyDrop::take(&mut self.co)) };
    }
}
