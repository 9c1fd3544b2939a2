//! The backlog: requests a loop has taken from /dev/fuse and not yet started, served
//! round robin by file handle, so that one client's deep queue does not hold another's
//! single request back.
//!
//! Why: the kernel keeps one FIFO of requests per connection. A client at iodepth 64
//! keeps ~64 requests in it, and a client at iodepth 1 beside it waits behind all of them
//! (fio, null export: its p99 5.6x its p99 alone, issue 34). In user space the order is
//! ours: a loop that finds requests queued takes what is there (reading a request costs
//! a fraction of serving it) and starts them one client at a time.
//!
//! The rule: READ and WRITE are keyed by their file handle (one per open of the image
//! export, so one per client job or VM disk); the backlog starts the oldest request of
//! the next handle after the last one started (in handle order, wrapping), so each
//! handle with requests waiting gets a turn. Requests of one handle keep their order.
//! Every other request is a barrier: nothing behind it starts before it, and it starts
//! only once it is the oldest (FLUSH, FSYNC, RELEASE, metadata: their order with the
//! data requests around them is the kernel's, as without a backlog).

use std::collections::VecDeque;

use fuse::abi::{FUSE_READ, FUSE_WRITE};
use fuse::decode::header_of;

/// How a request takes its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// A READ or WRITE on this file handle.
    Handle(u64),
    /// Anything else: starts in arrival order, and nothing overtakes it.
    Barrier,
}

impl Turn {
    /// The turn of `request` (its header and arguments, as read from /dev/fuse).
    pub fn of(request: &[u8]) -> Turn {
        let header = std::mem::size_of::<fuse::abi::fuse_in_header>();
        let fh_bytes = request.get(header..header + 8);
        match (header_of(request).map(|h| h.opcode), fh_bytes) {
            // `fh` is the first field of both fuse_read_in and fuse_write_in.
            (Some(FUSE_READ | FUSE_WRITE), Some(fh)) => {
                Turn::Handle(u64::from_ne_bytes(fh.try_into().expect("8 bytes")))
            }
            _ => Turn::Barrier,
        }
    }
}

/// Handles a backlog looks at when it looks for a shallow client.
pub const TRACKED: usize = 16;

/// The requests waiting per handle ([`Backlog::handle_counts`]).
pub struct HandleCounts {
    counts: [(u64, usize); TRACKED],
    handles: usize,
}

impl HandleCounts {
    /// Each handle counted, with its requests waiting.
    pub fn iter(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.counts[..self.handles].iter().copied()
    }
}

/// Requests waiting to start, in arrival order. The reader that fills it bounds it
/// ([`crate::read_ahead::ReadAhead::start`]).
pub struct Backlog<T> {
    waiting: VecDeque<(Turn, T)>,
    /// The handle whose request started last.
    last: Option<u64>,
}

impl<T> Backlog<T> {
    /// An empty backlog with room for `capacity` requests (allocated now, not per request).
    pub fn with_capacity(capacity: usize) -> Backlog<T> {
        Backlog {
            waiting: VecDeque::with_capacity(capacity),
            last: None,
        }
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Adds a request behind the others.
    pub fn push(&mut self, turn: Turn, request: T) {
        self.waiting.push_back((turn, request));
    }

    /// The requests waiting per handle, for the first [`TRACKED`] handles (no allocation):
    /// counted once per drain, for [`Backlog::victim`] and the read-ahead's deep handles.
    pub fn handle_counts(&self) -> HandleCounts {
        let mut counts = HandleCounts {
            counts: [(0, 0); TRACKED],
            handles: 0,
        };
        for (turn, _) in &self.waiting {
            let Turn::Handle(fh) = *turn else { continue };
            let handles = counts.handles;
            match counts.counts[..handles].iter_mut().find(|(h, _)| *h == fh) {
                Some((_, count)) => *count += 1,
                None if handles < TRACKED => {
                    counts.counts[handles] = (fh, 1);
                    counts.handles += 1;
                }
                None => {}
            }
        }
        counts
    }

    /// A handle that serving by turns helps, if there is one: the only request of its
    /// handle (a shallow client's, by `counts`, this backlog's [`Backlog::handle_counts`]),
    /// behind at least `behind` requests of other handles (a deep client's), and not one
    /// `known_deep` says had more waiting before (several deep clients each show a single
    /// request now and then: fio submits in bursts). Not when every client is shallow, nor
    /// when every one is deep: then arrival order serves them alike.
    pub fn victim(
        &self,
        counts: &HandleCounts,
        behind: usize,
        known_deep: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        let single = |fh: u64| counts.iter().any(|(h, n)| h == fh && n == 1);
        self.waiting
            .iter()
            .enumerate()
            .find_map(|(ahead, (turn, _))| match *turn {
                Turn::Handle(fh) if ahead >= behind && single(fh) && !known_deep(fh) => Some(fh),
                _ => None,
            })
    }

    /// Requests of handle `fh` waiting.
    pub fn count(&self, fh: u64) -> usize {
        self.waiting
            .iter()
            .filter(|(turn, _)| *turn == Turn::Handle(fh))
            .count()
    }

    /// The request to start now, if any (see the module docs for the rule).
    pub fn pop(&mut self) -> Option<T> {
        let (turn, _) = self.waiting.front()?;
        if *turn == Turn::Barrier {
            return self.waiting.pop_front().map(|(_, request)| request);
        }
        let handles = self.waiting.iter().map_while(|(turn, _)| match turn {
            Turn::Handle(fh) => Some(*fh),
            Turn::Barrier => None,
        });
        // The smallest handle after the last one, else the smallest (wrapping).
        let (mut after, mut smallest) = (None::<u64>, u64::MAX);
        for fh in handles {
            smallest = smallest.min(fh);
            if self.last.is_some_and(|last| fh > last) && after.is_none_or(|a| fh < a) {
                after = Some(fh);
            }
        }
        let next = after.unwrap_or(smallest);
        let at = self
            .waiting
            .iter()
            .position(|(turn, _)| *turn == Turn::Handle(next))
            .expect("a handle just seen");
        self.last = Some(next);
        self.waiting.remove(at).map(|(_, request)| request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(backlog: &mut Backlog<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| backlog.pop()).collect()
    }

    #[test]
    fn one_handle_keeps_its_order() {
        let mut backlog = Backlog::with_capacity(8);
        for name in ["a1", "a2", "a3"] {
            backlog.push(Turn::Handle(7), name);
        }
        assert_eq!(drain(&mut backlog), ["a1", "a2", "a3"]);
    }

    #[test]
    fn a_single_request_waits_for_one_of_a_deep_queue_at_most() {
        let mut backlog = Backlog::with_capacity(8);
        for name in ["w1", "w2", "w3", "w4"] {
            backlog.push(Turn::Handle(0), name);
        }
        backlog.push(Turn::Handle(4), "r1");
        assert_eq!(backlog.pop(), Some("w1"));
        assert_eq!(backlog.pop(), Some("r1"));
        backlog.push(Turn::Handle(4), "r2");
        assert_eq!(drain(&mut backlog), ["w2", "r2", "w3", "w4"]);
    }

    #[test]
    fn handles_take_turns_in_handle_order() {
        let mut backlog = Backlog::with_capacity(8);
        for (fh, name) in [(9, "c1"), (9, "c2"), (1, "a1"), (1, "a2"), (5, "b1")] {
            backlog.push(Turn::Handle(fh), name);
        }
        assert_eq!(drain(&mut backlog), ["a1", "b1", "c1", "a2", "c2"]);
    }

    #[test]
    fn nothing_overtakes_a_barrier_and_it_waits_for_those_before_it() {
        let mut backlog = Backlog::with_capacity(8);
        backlog.push(Turn::Handle(1), "a1");
        backlog.push(Turn::Handle(1), "a2");
        backlog.push(Turn::Barrier, "flush");
        backlog.push(Turn::Handle(2), "b1");
        assert_eq!(drain(&mut backlog), ["a1", "a2", "flush", "b1"]);
    }

    #[test]
    fn a_victim_is_a_lone_request_behind_a_deep_queue() {
        let mut backlog = Backlog::with_capacity(16);
        for _ in 0..4 {
            backlog.push(Turn::Handle(0), "w");
        }
        assert_eq!(
            backlog.victim(&backlog.handle_counts(), 4, |_| false),
            None,
            "one deep client"
        );
        backlog.push(Turn::Handle(256), "r");
        assert_eq!(
            backlog.victim(&backlog.handle_counts(), 4, |_| false),
            Some(256),
            "a shallow client behind it"
        );
        assert_eq!(
            backlog.victim(&backlog.handle_counts(), 5, |_| false),
            None,
            "not behind enough"
        );
        assert_eq!(
            backlog.victim(&backlog.handle_counts(), 4, |fh| fh == 256),
            None,
            "a client that had more waiting before"
        );
        backlog.push(Turn::Handle(256), "r");
        assert_eq!(
            backlog.victim(&backlog.handle_counts(), 4, |_| false),
            None,
            "two deep clients"
        );
        assert_eq!(
            (backlog.count(256), backlog.count(0), backlog.count(1)),
            (2, 4, 0)
        );

        let mut shallow = Backlog::with_capacity(16);
        for fh in 0..4 {
            shallow.push(Turn::Handle(fh << 8), "r");
        }
        assert_eq!(
            shallow.victim(&shallow.handle_counts(), 4, |_| false),
            None,
            "only shallow clients"
        );
    }

    #[test]
    fn len_counts_the_requests_waiting() {
        let mut backlog = Backlog::with_capacity(2);
        assert!(backlog.is_empty());
        backlog.push(Turn::Barrier, "x");
        backlog.push(Turn::Barrier, "y");
        assert_eq!(backlog.len(), 2);
    }

    #[test]
    fn turns_come_from_the_request() {
        let header = std::mem::size_of::<fuse::abi::fuse_in_header>();
        let mut request = vec![0u8; header + 40];
        request[4..8].copy_from_slice(&FUSE_WRITE.to_ne_bytes());
        request[header..header + 8].copy_from_slice(&42u64.to_ne_bytes());
        assert_eq!(Turn::of(&request), Turn::Handle(42));
        request[4..8].copy_from_slice(&fuse::abi::FUSE_FLUSH.to_ne_bytes());
        assert_eq!(Turn::of(&request), Turn::Barrier);
        assert_eq!(Turn::of(&request[..10]), Turn::Barrier);
    }
}
