//! Block-range locks for the file backend's O_DIRECT mode: a read-modify-write of a partial
//! block is ordered against the requests that touch the same blocks, and only those.
//!
//! O_DIRECT moves whole logical blocks. A write that starts or ends inside a block must read
//! that block, patch it and write it back (a read-modify-write, RMW). If another write to the
//! block lands between the read and the write-back, the write-back puts old bytes over it and
//! loses bytes that the RMW never meant to touch. So:
//! - an RMW holds its span **exclusively**;
//! - every other modification of blocks (aligned writes, writes bounced only for memory
//!   alignment, discard, write-zeroes) holds its span **shared**. Shared holders never wait
//!   for each other, only for an overlapping exclusive request, whether it holds its span or
//!   still waits for it (arrival order: a stream of aligned writes cannot starve an RMW);
//! - reads take nothing: an RMW writes back exactly the bytes a read would have seen.
//!
//! Requests on other blocks never wait, whatever is stalled: there is no lock on the image.
//!
//! # Cost
//! Taking a shared span is one uncontended mutex round trip to register and one to leave,
//! plus a scan of the exclusive holders, of which there are normally none: O(1) for the
//! aligned writes that make up the traffic. Taking an exclusive span scans every holder:
//! O(requests in flight), paid only by an RMW. Holders live in slabs that grow to the
//! high-water mark of requests in flight and then stop allocating.
//!
//! # Waiting, in every [`Ctx`]
//! Threads sleep on a condition variable that every release signals. A coroutine must not
//! block its loop, and the holder may run on another thread (another queue, a worker), for
//! which the runtime has no wakeup yet; so it yields once (the holder may finish within this
//! turn of the loop) and then sleeps on an io_uring timeout, from 20 µs doubling to 1 ms,
//! and looks again. That costs a timer SQE per step, not a spinning CPU, and only while a
//! request actually conflicts with an RMW.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use slab::Slab;

use crate::Ctx;

/// First and largest sleep of a waiting coroutine.
const FIRST_NAP: Duration = Duration::from_micros(20);
const LONGEST_NAP: Duration = Duration::from_millis(1);
/// Holders the slabs have room for before they grow.
const INITIAL_HOLDERS: usize = 256;

/// The byte range `[start, end)` of whole blocks a request works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The locks of one image.
pub(crate) struct RangeLocks {
    state: Mutex<State>,
    released: Condvar,
    waits: AtomicU64,
}

struct State {
    shared: Slab<Span>,
    /// Exclusive requests, holding or waiting, with their arrival ticket.
    exclusive: Slab<(Span, u64)>,
    next_ticket: u64,
    /// Threads asleep on `released`.
    sleepers: usize,
}

/// How a span is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Alongside other shared holders; ordered only against exclusive ones.
    Shared,
    /// Alone: ordered against every holder of an overlapping span.
    Exclusive,
}

impl Default for RangeLocks {
    fn default() -> Self {
        RangeLocks {
            state: Mutex::new(State {
                shared: Slab::with_capacity(INITIAL_HOLDERS),
                exclusive: Slab::with_capacity(INITIAL_HOLDERS),
                next_ticket: 0,
                sleepers: 0,
            }),
            released: Condvar::new(),
            waits: AtomicU64::new(0),
        }
    }
}

impl RangeLocks {
    /// Waits until `span` can be held in `mode`, then holds it until the guard drops.
    pub(crate) fn lock(&self, cx: &Ctx<'_>, span: Span, mode: Mode) -> RangeGuard<'_> {
        let mut state = self.state();
        let key = match mode {
            Mode::Shared => {
                let mut waiter = Waiter::new(cx);
                while state.exclusive.iter().any(|(_, (s, _))| s.overlaps(&span)) {
                    state = waiter.wait(self, state);
                }
                state.shared.insert(span)
            }
            Mode::Exclusive => {
                let ticket = state.next_ticket;
                state.next_ticket += 1;
                let key = state.exclusive.insert((span, ticket));
                let mut waiter = Waiter::new(cx);
                while state.blocks_exclusive(&span, ticket) {
                    state = waiter.wait(self, state);
                }
                key
            }
        };
        RangeGuard {
            locks: self,
            mode,
            key,
        }
    }

    /// Times a request found its span taken and waited (for the tests and the logs).
    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, mode: Mode, key: usize) {
        let mut state = self.state();
        match mode {
            Mode::Shared => drop(state.shared.remove(key)),
            Mode::Exclusive => drop(state.exclusive.remove(key)),
        }
        if state.sleepers > 0 {
            self.released.notify_all();
        }
    }
}

impl State {
    /// Whether an exclusive request `ticket` on `span` must still wait: for a shared holder,
    /// or an earlier exclusive request, on an overlapping span.
    fn blocks_exclusive(&self, span: &Span, ticket: u64) -> bool {
        self.shared.iter().any(|(_, s)| s.overlaps(span))
            || self
                .exclusive
                .iter()
                .any(|(_, (s, t))| *t < ticket && s.overlaps(span))
    }
}

/// One request's way of waiting, with its coroutine's backoff.
struct Waiter<'c> {
    cx: &'c Ctx<'c>,
    nap: Option<Duration>,
}

impl<'c> Waiter<'c> {
    fn new(cx: &'c Ctx<'c>) -> Self {
        Waiter { cx, nap: None }
    }

    /// Lets go of `state` until something may have been released, then takes it again.
    fn wait<'l>(
        &mut self,
        locks: &'l RangeLocks,
        state: MutexGuard<'l, State>,
    ) -> MutexGuard<'l, State> {
        locks.waits.fetch_add(1, Ordering::Relaxed);
        match self.cx {
            Ctx::Blocking => {
                let mut state = state;
                state.sleepers += 1;
                let mut state = locks
                    .released
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
                state.sleepers -= 1;
                state
            }
            Ctx::Coroutine(co) => {
                drop(state);
                match self.nap {
                    None => co.yield_now(),
                    Some(nap) => {
                        if let Err(e) = co.ctx().sleep(nap) {
                            log::debug!("range lock backoff: {e}; yielding instead");
                            co.yield_now();
                        }
                    }
                }
                self.nap = Some(self.nap.map_or(FIRST_NAP, |n| (n * 2).min(LONGEST_NAP)));
                locks.state()
            }
        }
    }
}

/// A held span; released on drop (also when a coroutine is unwound).
pub(crate) struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    mode: Mode,
    key: usize,
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.locks.release(self.mode, self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::thread;

    use super::*;

    fn span(start: u64, end: u64) -> Span {
        Span { start, end }
    }

    #[test]
    fn shared_holders_never_wait_for_each_other() {
        let locks = RangeLocks::default();
        let guards: Vec<_> = (0..1000)
            .map(|_| locks.lock(&Ctx::Blocking, span(0, 4096), Mode::Shared))
            .collect();
        drop(guards);
        assert_eq!(locks.waits(), 0);
    }

    #[test]
    fn disjoint_exclusive_spans_do_not_wait() {
        let locks = RangeLocks::default();
        let _a = locks.lock(&Ctx::Blocking, span(0, 4096), Mode::Exclusive);
        let _b = locks.lock(&Ctx::Blocking, span(4096, 8192), Mode::Exclusive);
        let _c = locks.lock(&Ctx::Blocking, span(8192, 9000), Mode::Shared);
        assert_eq!(locks.waits(), 0);
    }

    /// A thread holding `held` exclusively, released when `go` is set.
    fn hold(locks: &Arc<RangeLocks>, held: Span, go: &Arc<AtomicBool>) -> thread::JoinHandle<()> {
        let (locks, go) = (Arc::clone(locks), Arc::clone(go));
        let (taken_tx, taken_rx) = std::sync::mpsc::channel();
        let holder = thread::spawn(move || {
            let _guard = locks.lock(&Ctx::Blocking, held, Mode::Exclusive);
            taken_tx.send(()).unwrap();
            while !go.load(Ordering::SeqCst) {
                thread::yield_now();
            }
        });
        taken_rx.recv().unwrap();
        holder
    }

    #[test]
    fn only_overlapping_requests_wait_for_an_exclusive_holder() {
        let locks = Arc::new(RangeLocks::default());
        let go = Arc::new(AtomicBool::new(false));
        let holder = hold(&locks, span(4096, 8192), &go);
        // Elsewhere: neither mode waits.
        drop(locks.lock(&Ctx::Blocking, span(0, 4096), Mode::Shared));
        drop(locks.lock(&Ctx::Blocking, span(8192, 12288), Mode::Exclusive));
        assert_eq!(locks.waits(), 0);
        // Overlapping: waits until the holder lets go.
        let (locks2, go2) = (Arc::clone(&locks), Arc::clone(&go));
        let waiter = thread::spawn(move || {
            let _g = locks2.lock(&Ctx::Blocking, span(0, 5000), Mode::Shared);
            assert!(go2.load(Ordering::SeqCst), "got the span while it was held");
        });
        while locks.waits() == 0 {
            thread::yield_now();
        }
        go.store(true, Ordering::SeqCst);
        holder.join().unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn a_waiting_exclusive_request_stops_newer_shared_ones() {
        let locks = RangeLocks::default();
        let shared = locks.lock(&Ctx::Blocking, span(0, 4096), Mode::Shared);
        // Queue an exclusive request behind `shared` without blocking this thread: register
        // it by hand, as `lock` does before it waits.
        let ticket = {
            let mut state = locks.state();
            let t = state.next_ticket;
            state.next_ticket += 1;
            state.exclusive.insert((span(0, 4096), t));
            t
        };
        let state = locks.state();
        assert!(
            state.blocks_exclusive(&span(0, 4096), ticket),
            "waits for the holder"
        );
        assert!(
            state
                .exclusive
                .iter()
                .any(|(_, (s, _))| s.overlaps(&span(100, 200))),
            "a newer shared request would wait for it"
        );
        drop(state);
        drop(shared);
        assert!(!locks.state().blocks_exclusive(&span(0, 4096), ticket));
    }

    #[test]
    fn a_coroutine_waits_without_blocking_its_loop() {
        let rt = runtime::Runtime::new(runtime::Config::default()).unwrap();
        let locks = Arc::new(RangeLocks::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let (l, o) = (Arc::clone(&locks), Arc::clone(&order));
        rt.block_on(move |co| {
            let cx = Ctx::Coroutine(co);
            let held = l.lock(&cx, span(0, 512), Mode::Exclusive);
            let (l2, o2) = (Arc::clone(&l), Arc::clone(&o));
            let waiter = co
                .spawn_joinable(move |co| {
                    let _g = l2.lock(&Ctx::Coroutine(co), span(256, 1024), Mode::Exclusive);
                    o2.lock().unwrap().push("waiter");
                })
                .unwrap();
            co.ctx().sleep(Duration::from_millis(2)).unwrap(); // the waiter naps meanwhile
            o.lock().unwrap().push("holder");
            drop(held);
            waiter.join(co).unwrap();
        })
        .unwrap();
        assert_eq!(*order.lock().unwrap(), ["holder", "waiter"]);
        assert!(locks.waits() >= 2, "yielded, then slept: {}", locks.waits());
    }
}
