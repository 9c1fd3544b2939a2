//! The loops of FUSE over io_uring in the idle scheduling class, and the guard that takes a
//! starved loop back to the normal class.
//!
//! Why the idle class: see `runtime::sched_class` (the client of a ring queue stays on its
//! CPU instead of moving on every request: 3x the IOPS at iodepth 1). Why a guard: a loop
//! in the idle class gets a CPU only when nothing else wants it, so beside a CPU hog it
//! serves almost nothing. The supervisor reads each loop thread's `schedstat` every
//! [`WINDOW`]: a loop that waited long for its CPU each time it got one ([`starved`]) goes
//! back to the normal class for a hold ([`HOLD`], doubled each time it starves again, up to
//! [`MAX_HOLD`]), then is tried in the idle class again. Serving a client on its own CPU,
//! a loop waits ~1 us per slice (the client runs until its next request); beside a hog,
//! ~15 ms.
//!
//! A loop goes idle only if the process may leave the class again
//! (`runtime::sched_class::can_leave_idle`), and goes back to the normal class when the
//! session's part on it ends (the loops of a set may serve other sessions).

use std::time::{Duration, Instant};

use transport::placement::{Reading, ThreadClock, Waits};

/// How often the guard looks at the loops.
pub const WINDOW: Duration = Duration::from_millis(50);
/// A window in which a loop waited at least this long in all ...
pub const STARVED_WAIT: Duration = Duration::from_millis(5);
/// ... and this long on average each time before it got its CPU, is starved.
pub const STARVED_PER_SLICE: Duration = Duration::from_micros(500);
/// The first time a starved loop spends in the normal class.
pub const HOLD: Duration = Duration::from_secs(1);
/// The longest.
pub const MAX_HOLD: Duration = Duration::from_secs(16);

/// Whether a loop in the idle class that waited `waits` is starved.
pub fn starved(waits: Waits) -> bool {
    waits.waited >= STARVED_WAIT
        && waits.waited.as_nanos() >= STARVED_PER_SLICE.as_nanos() * u128::from(waits.slices.max(1))
}

/// One guarded loop thread.
struct Guarded {
    tid: libc::pid_t,
    clock: ThreadClock,
    last: Reading,
    /// `Some(until)` while in the normal class.
    normal_until: Option<Instant>,
    hold: Duration,
}

/// The guard of one session's loops.
pub struct ClassGuard {
    loops: Vec<Guarded>,
    next: Instant,
    /// Times a loop was taken back to the normal class.
    pub starvations: u64,
}

impl ClassGuard {
    /// A guard of the loop threads `tids`, which are in the idle class now.
    pub fn new(tids: &[libc::pid_t], now: Instant) -> ClassGuard {
        let loops = tids
            .iter()
            .filter_map(|&tid| {
                let clock = ThreadClock::of_thread(tid as u32)
                    .inspect_err(|e| log::warn!("loop thread {tid}: no scheduler clock ({e}): not guarded, back to the normal class"))
                    .ok();
                let Some((clock, last)) = clock.and_then(|c| c.read().ok().map(|r| (c, r))) else {
                    let _ = runtime::sched_class::set_idle(tid, false);
                    return None;
                };
                Some(Guarded {
                    tid,
                    clock,
                    last,
                    normal_until: None,
                    hold: HOLD,
                })
            })
            .collect();
        ClassGuard {
            loops,
            next: now + WINDOW,
            starvations: 0,
        }
    }

    /// Looks at the loops if a window has passed; returns when to call again.
    pub fn tick(&mut self, now: Instant) -> Instant {
        if now < self.next {
            return self.next;
        }
        self.next = now + WINDOW;
        for g in &mut self.loops {
            let Ok(reading) = g.clock.read() else {
                continue;
            };
            let waits = reading.waits_since(&g.last);
            g.last = reading;
            match g.normal_until {
                None if starved(waits) => {
                    match runtime::sched_class::set_idle(g.tid, false) {
                        Ok(()) => log::debug!(
                            "loop thread {}: starved in the idle class ({} us waited over {} slices in {} ms): normal class for {} ms",
                            g.tid,
                            waits.waited.as_micros(),
                            waits.slices,
                            waits.over.as_millis(),
                            g.hold.as_millis()
                        ),
                        Err(e) => log::warn!("loop thread {}: starved in the idle class, and cannot leave it: {e}", g.tid),
                    }
                    self.starvations += 1;
                    g.normal_until = Some(now + g.hold);
                    g.hold = (g.hold * 2).min(MAX_HOLD);
                }
                None => {}
                Some(until)
                    if now >= until && runtime::sched_class::set_idle(g.tid, true).is_ok() =>
                {
                    log::debug!("loop thread {}: back in the idle class", g.tid);
                    g.normal_until = None;
                }
                Some(_) => {}
            }
        }
        self.next
    }
}

/// The session is over: every guarded loop back in the normal class (a loop also does
/// this itself when its part ends; a guard that put it back in the idle class just
/// before must not leave it there: loops of a set serve other sessions too).
impl Drop for ClassGuard {
    fn drop(&mut self) {
        for g in &self.loops {
            let _ = runtime::sched_class::set_idle(g.tid, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(waited_us: u64, slices: u64) -> Waits {
        Waits {
            waited: Duration::from_micros(waited_us),
            slices,
            over: WINDOW,
        }
    }

    #[test]
    fn a_loop_serving_its_cpus_client_is_not_starved() {
        // Measured: iodepth 1, ~1 us per slice; iodepth 64, ~170 us per slice.
        assert!(!starved(waits(2_500, 2_300)));
        assert!(!starved(waits(13_000, 77)));
        assert!(!starved(waits(0, 0)));
    }

    #[test]
    fn a_loop_beside_a_hog_is_starved() {
        // Measured: ~15 ms per slice, 67 slices a second.
        assert!(starved(waits(45_000, 3)));
        // Waited the whole window without getting the CPU once.
        assert!(starved(waits(50_000, 0)));
        // Long waits, but too little in all to matter yet.
        assert!(!starved(waits(4_000, 2)));
    }
}
