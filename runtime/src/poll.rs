//! Adaptive polling before the loop sleeps, in the manner of QEMU's `poll-max-ns`.
//!
//! Spinning on the completion queue for a few microseconds saves the sleep and the wakeup
//! of this CPU (~20 µs on an idle vCPU here) when work arrives one piece at a time, but
//! burns CPU when nothing comes. The window therefore adapts to how long the loop really
//! waited: a wait longer than the maximum shrinks it to nothing (an idle loop stops
//! spinning after one long sleep); a wait shorter than the maximum but longer than the
//! window grows it (doubling from 4 µs). A wait within the window changes nothing.

use std::cell::Cell;
use std::time::Duration;

const FIRST_WINDOW_NS: u64 = 4_000;

pub(crate) struct AdaptivePoll {
    max_ns: u64,
    window_ns: Cell<u64>,
}

impl AdaptivePoll {
    pub(crate) fn new(max_ns: u64) -> Self {
        AdaptivePoll {
            max_ns,
            window_ns: Cell::new(max_ns.min(FIRST_WINDOW_NS)),
        }
    }

    /// Whether polling is configured at all.
    pub(crate) fn enabled(&self) -> bool {
        self.max_ns > 0
    }

    /// How long to spin before the next sleep.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.get())
    }

    /// Adjusts the window after a wait (spinning included) that lasted `waited`.
    pub(crate) fn adjust(&self, waited: Duration) {
        let waited = waited.as_nanos() as u64;
        let window = self.window_ns.get();
        if waited <= window {
            return;
        }
        let next = if waited > self.max_ns {
            0
        } else if window == 0 {
            FIRST_WINDOW_NS.min(self.max_ns)
        } else {
            (window * 2).min(self.max_ns)
        };
        self.window_ns.set(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_grows_on_short_waits_and_collapses_on_long_ones() {
        let poll = AdaptivePoll::new(50_000);
        assert_eq!(poll.window(), Duration::from_micros(4));
        poll.adjust(Duration::from_micros(2)); // caught within the window: unchanged
        assert_eq!(poll.window(), Duration::from_micros(4));
        poll.adjust(Duration::from_micros(10)); // short wait: grow
        poll.adjust(Duration::from_micros(10));
        assert_eq!(poll.window(), Duration::from_micros(16));
        for _ in 0..5 {
            poll.adjust(Duration::from_micros(40));
        }
        assert_eq!(
            poll.window(),
            Duration::from_micros(50),
            "bounded by the maximum"
        );
        poll.adjust(Duration::from_millis(5)); // idle: stop spinning
        assert_eq!(poll.window(), Duration::ZERO);
        poll.adjust(Duration::from_micros(10)); // work is back: start again small
        assert_eq!(poll.window(), Duration::from_micros(4));
    }

    #[test]
    fn zero_maximum_never_polls() {
        let poll = AdaptivePoll::new(0);
        assert!(!poll.enabled());
        poll.adjust(Duration::from_micros(10));
        assert_eq!(poll.window(), Duration::ZERO);
    }
}
