//! Loop placement: which of several /dev/fuse loops take requests, so that one default
//! serves iodepth 1 on the client's CPU and iodepth 64 with the daemon's own CPU.
//!
//! Why: the loops share the session's input queue, and each is pinned to a CPU. At
//! iodepth 1 the client sleeps between requests; the loop on its CPU serves each one
//! without a cross-CPU wakeup, which on a small VM costs more than the request itself
//! (2-3x the IOPS of one floating loop). At iodepth 64 the client never sleeps: the loop
//! on its CPU takes CPU time from it, and the two loops wake each other for the same
//! requests. There, one loop on the other CPU does better (fio, 4 KiB, null: 0.75-0.8x of
//! one loop with both taking requests). Which case holds changes with the workload, so
//! it is measured while serving, not configured.
//!
//! How, by measurement while serving: the loops publish how many requests they have
//! read, and a [`Controller`] (the daemon's main thread) runs trials. It measures the
//! session's request rate for [`TRIAL`], makes one move, lets it [`SETTLE`], measures
//! again, undoes the move and measures a third time; it makes the move for good only if
//! the moved rate beat the mean of the two others by [`GAIN`] (the third measurement
//! cancels a load that drifts during the trial).
//! The move is: pause the queue of the loop whose thread waited longest for its CPU (the
//! run delay of `/proc/thread-self/schedstat`, which the loops publish too: the CPU the
//! client keeps busy), if more than one loop takes requests; else take a paused loop
//! back. Between trials it holds for [`HOLD`], doubled after each trial that changed
//! nothing (up to [`MAX_HOLD`]), so a settled workload spends 70 ms of every 3.4 s in
//! the state it does not keep. An idle session (below [`IDLE_RATE`]) has every loop taking requests, so that
//! the next burst is served where it comes from. With a client on every CPU, pausing a
//! loop serves less and is undone.
//!
//! Guarantees: at least one loop takes requests at any time (a trial pauses a loop only
//! while another one takes requests), a pause lasts until a trial or idleness ends it,
//! and a paused loop still notices the unmount (it polls its /dev/fuse fd every
//! [`TICK`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long each of a trial's three measurements lasts.
pub const TRIAL: Duration = Duration::from_millis(50);
/// Time given to a change before its rate is measured (the client moves between CPUs,
/// queued requests drain).
pub const SETTLE: Duration = Duration::from_millis(20);
/// Time between trials; doubled after each trial that kept the state, up to
/// [`MAX_HOLD`], and back to this after a change.
pub const HOLD: Duration = Duration::from_millis(400);
/// The longest time between trials.
pub const MAX_HOLD: Duration = Duration::from_millis(3200);
/// A trial's new state is kept only if it served this much more (thousandths: 3%).
pub const GAIN: u64 = 1030;
/// Below this many requests per second the session counts as idle: every loop takes
/// requests (the next burst starts served where it comes from) and no trial runs.
pub const IDLE_RATE: u64 = 2000;

/// What the loops of one session share with the controller.
#[derive(Debug)]
pub struct Placement {
    slots: Box<[Slot]>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Requests the loop's queue has read so far (written by the loop only).
    requests: Arc<AtomicU64>,
    /// The loop thread's id, once it runs (0 before).
    tid: AtomicU32,
    /// The controller's choice: take no request.
    paused: AtomicBool,
}

impl Placement {
    /// A placement for `loops` loops, every one taking requests.
    pub fn new(loops: usize) -> Placement {
        Placement {
            slots: (0..loops).map(|_| Slot::default()).collect(),
        }
    }

    /// Called on loop `index`'s thread when it starts: the counter its queue counts the
    /// requests it reads into ([`Queue::count_into`](crate::Queue::count_into)).
    pub fn register(&self, index: usize) -> Arc<AtomicU64> {
        // `/proc/thread-self` links to `PID/task/TID`.
        let tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|link| link.file_name()?.to_str()?.parse().ok());
        match tid {
            Some(tid) => self.slots[index].tid.store(tid, Ordering::Relaxed),
            None => log::warn!("loop {index}: no thread id: the placement cannot see its CPU"),
        }
        Arc::clone(&self.slots[index].requests)
    }

    /// Whether the controller wants loop `index` to take no request.
    pub fn is_paused(&self, index: usize) -> bool {
        self.slots[index].paused.load(Ordering::Relaxed)
    }

    /// The loops paused now.
    pub fn paused(&self) -> usize {
        (0..self.slots.len()).filter(|&i| self.is_paused(i)).count()
    }

    /// Every loop takes requests (for the end of the session: a paused loop has no read
    /// to see the unmount with).
    pub fn resume_all(&self) {
        for slot in self.slots.iter() {
            slot.paused.store(false, Ordering::Relaxed);
        }
    }

    /// Requests read by all loops so far.
    fn requests(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.requests.load(Ordering::Relaxed))
            .sum()
    }

    fn set_paused(&self, index: usize, paused: bool) {
        self.slots[index].paused.store(paused, Ordering::Relaxed);
    }

    /// The move a trial tries from the current state, given each loop's run delay over
    /// the measurement just made: pause the loop taking requests whose CPU is the most
    /// contended, if more than one takes requests; else take a paused loop back.
    fn trial_move(&self, delays: &[u32]) -> Option<Move> {
        let taking = (0..self.slots.len()).filter(|&i| !self.is_paused(i));
        if taking.clone().count() > 1 {
            let busiest = taking.max_by_key(|&i| delays.get(i).copied().unwrap_or(0))?;
            return Some(Move::Pause(busiest));
        }
        (0..self.slots.len())
            .find(|&i| self.is_paused(i))
            .map(Move::Resume)
    }

    fn apply(&self, m: Move, forward: bool) {
        match m {
            Move::Pause(i) => self.set_paused(i, forward),
            Move::Resume(i) => self.set_paused(i, !forward),
        }
    }
}

/// One step of a trial: pause a loop, or take one back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Move {
    Pause(usize),
    Resume(usize),
}

/// Where the controller is. A trial measures A (the state as it is), B (one move made),
/// then A again, and keeps the move if B beat the mean of the two A's: the second A
/// cancels a load that drifts during the trial.
#[derive(Clone, Copy, Debug)]
enum Phase {
    /// Nothing to do until then.
    Hold { until: Instant },
    /// Measuring: requests at the start, and the stage.
    Measure {
        stage: Stage,
        since: Instant,
        requests: u64,
    },
    /// A change is settling before the next measurement.
    Settle { stage: Stage, until: Instant },
}

/// The measurements of a trial so far.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// The state as it is.
    Before,
    /// The move made, and the rate before it.
    After { m: Move, before: u64 },
    /// The move undone, and the two rates so far.
    Back { m: Move, before: u64, after: u64 },
}

/// What the controller did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControllerStats {
    /// Trials run.
    pub trials: u64,
    /// Trials whose move was kept.
    pub kept: u64,
}

/// What a [`Controller::tick`] asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    /// Call again at this time (or earlier).
    pub at: Instant,
    /// Some loop's choice changed: wake the loops so that they apply it.
    pub changed: bool,
}

/// The controller, run by the daemon's main thread: it measures the session's request
/// rate as it is, tries one move (pause the most contended loop, or take a paused one
/// back), measures again, and keeps whichever served more; then it waits before the next
/// trial, longer each time nothing changed. It wakes only at the deadlines it returns.
#[derive(Debug)]
pub struct Controller {
    phase: Phase,
    hold: Duration,
    stats: ControllerStats,
    /// Each loop's scheduler clock, once its thread is known.
    clocks: Vec<Option<ThreadClock>>,
    /// Their readings at the start of the current measurement.
    readings: Vec<Option<Reading>>,
}

impl Controller {
    /// A controller for `placement` that starts its first trial after [`HOLD`].
    pub fn new(placement: &Placement, now: Instant) -> Controller {
        let loops = placement.slots.len();
        Controller {
            phase: Phase::Hold { until: now + HOLD },
            hold: HOLD,
            stats: ControllerStats::default(),
            clocks: (0..loops).map(|_| None).collect(),
            readings: vec![None; loops],
        }
    }

    /// Its counts so far.
    pub fn stats(&self) -> ControllerStats {
        self.stats
    }

    /// Advances the controller at `now`.
    pub fn tick(&mut self, placement: &Placement, now: Instant) -> Next {
        let requests = placement.requests();
        let mut changed = false;
        let measure = |stage| Phase::Measure {
            stage,
            since: now,
            requests,
        };
        self.phase = match self.phase {
            Phase::Hold { until } if now < until => self.phase,
            Phase::Hold { .. } => {
                self.read_clocks(placement);
                measure(Stage::Before)
            }
            Phase::Settle { until, .. } if now < until => self.phase,
            Phase::Settle { stage, .. } => measure(stage),
            Phase::Measure { since, .. } if now < since + TRIAL => self.phase,
            Phase::Measure {
                stage,
                since,
                requests: r0,
            } => {
                let rate = per_second(requests - r0, now.duration_since(since));
                match stage {
                    Stage::Before if rate < IDLE_RATE => {
                        changed = placement.paused() > 0;
                        placement.resume_all();
                        self.hold = HOLD;
                        Phase::Hold { until: now + HOLD }
                    }
                    Stage::Before => match placement.trial_move(&self.delays()) {
                        Some(m) => {
                            placement.apply(m, true);
                            changed = true;
                            let stage = Stage::After { m, before: rate };
                            Phase::Settle {
                                stage,
                                until: now + SETTLE,
                            }
                        }
                        None => Phase::Hold {
                            until: now + self.hold,
                        },
                    },
                    Stage::After { m, before } => {
                        placement.apply(m, false);
                        changed = true;
                        let stage = Stage::Back {
                            m,
                            before,
                            after: rate,
                        };
                        Phase::Settle {
                            stage,
                            until: now + SETTLE,
                        }
                    }
                    Stage::Back { m, before, after } => {
                        let unmoved = (before + rate) / 2;
                        self.stats.trials += 1;
                        let kept = after * 1000 > unmoved * GAIN;
                        if kept {
                            placement.apply(m, true);
                            changed = true;
                            self.stats.kept += 1;
                            self.hold = HOLD;
                        } else {
                            self.hold = (self.hold * 2).min(MAX_HOLD);
                        }
                        log::debug!(
                            "placement trial {m:?}: {before}/s, {after}/s moved, {rate}/s: {}",
                            if kept { "kept" } else { "not kept" }
                        );
                        Phase::Hold {
                            until: now + self.hold,
                        }
                    }
                }
            }
        };
        let at = match self.phase {
            Phase::Hold { until } | Phase::Settle { until, .. } => until,
            Phase::Measure { since, .. } => since + TRIAL,
        };
        Next { at, changed }
    }

    /// Reads every loop's clock (opening those of loops that registered since).
    fn read_clocks(&mut self, placement: &Placement) {
        for (i, slot) in placement.slots.iter().enumerate() {
            let tid = slot.tid.load(Ordering::Relaxed);
            if self.clocks[i].is_none() && tid != 0 {
                self.clocks[i] = ThreadClock::of_thread(tid).ok();
            }
            self.readings[i] = self.clocks[i].as_ref().and_then(|c| c.read().ok());
        }
    }

    /// Each loop's run delay since [`read_clocks`](Self::read_clocks), thousandths (0
    /// where unknown).
    fn delays(&self) -> Vec<u32> {
        self.clocks
            .iter()
            .zip(&self.readings)
            .map(|(clock, earlier)| match (clock, earlier) {
                (Some(clock), Some(earlier)) => {
                    clock.read().map_or(0, |now| now.delay_since(earlier))
                }
                _ => 0,
            })
            .collect()
    }
}

fn per_second(count: u64, over: Duration) -> u64 {
    (u128::from(count) * 1_000_000 / over.as_micros().max(1)) as u64
}

/// A thread's scheduler clock: CPU time and run delay, from its `schedstat` in /proc
/// (opened once, read with one `pread` each time).
#[derive(Debug)]
pub struct ThreadClock {
    file: File,
}

/// One reading of a [`ThreadClock`].
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    at: Instant,
    /// Nanoseconds spent waiting for a CPU while runnable.
    delay_ns: u64,
}

impl ThreadClock {
    /// The clock of the calling thread.
    #[cfg(test)]
    fn of_this_thread() -> io::Result<ThreadClock> {
        File::open("/proc/thread-self/schedstat").map(|file| ThreadClock { file })
    }

    /// The clock of thread `tid` of this process.
    pub fn of_thread(tid: u32) -> io::Result<ThreadClock> {
        File::open(format!("/proc/self/task/{tid}/schedstat")).map(|file| ThreadClock { file })
    }

    /// Reads it now.
    pub fn read(&self) -> io::Result<Reading> {
        let mut text = [0u8; 96];
        let n = self.file.read_at(&mut text, 0)?;
        let parsed = parse_schedstat(&text[..n]).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unexpected schedstat format")
        })?;
        Ok(Reading {
            at: Instant::now(),
            delay_ns: parsed.1,
        })
    }
}

impl Reading {
    /// The run delay between `earlier` and this reading, in thousandths of the time
    /// between them.
    pub fn delay_since(&self, earlier: &Reading) -> u32 {
        let wall = self.at.duration_since(earlier.at).as_nanos().max(1);
        let delay = u128::from(self.delay_ns.saturating_sub(earlier.delay_ns));
        u32::try_from(delay * 1000 / wall).unwrap_or(u32::MAX)
    }
}

/// `schedstat`'s first two fields: time on a CPU and time waiting on a run queue (ns).
fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_cpu_and_delay() {
        assert_eq!(parse_schedstat(b"123 456 7\n"), Some((123, 456)));
        assert_eq!(parse_schedstat(b"123\n"), None);
        assert_eq!(parse_schedstat(b"x 1 2\n"), None);
    }

    #[test]
    fn this_thread_clock_advances() {
        let cpu_ns = || {
            let text = std::fs::read("/proc/thread-self/schedstat").unwrap();
            parse_schedstat(&text).expect("this kernel's format").0
        };
        let clock = ThreadClock::of_this_thread().unwrap();
        let a = clock.read().unwrap();
        let start = cpu_ns();
        // Spins until the thread has run 10 ms on a CPU, however long a loaded machine
        // takes to give it that (no timing assertion: only that the clock moves).
        let mut x = 0u64;
        while cpu_ns() < start + 10_000_000 {
            assert!(a.at.elapsed() < Duration::from_secs(60), "never scheduled");
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let b = clock.read().unwrap();
        assert!(b.delay_since(&a) <= 1000, "a share of the time between");
    }

    /// Drives a controller over a session whose loops serve `rate(placement)` requests
    /// per second, for `secs` seconds, calling it at the times it asks for.
    fn drive(
        p: &Placement,
        c: &mut Controller,
        t: &mut Instant,
        secs: u64,
        rate: impl Fn(&Placement) -> u64,
    ) {
        let end = *t + Duration::from_secs(secs);
        let mut next = *t;
        while *t < end {
            *t += Duration::from_millis(1);
            let per_ms = rate(p) / 1000;
            p.slots[0].requests.fetch_add(per_ms, Ordering::Relaxed);
            if *t >= next {
                next = c.tick(p, *t).at;
            }
        }
    }

    #[test]
    fn pausing_a_loop_is_kept_where_it_serves_more() {
        let p = Placement::new(2);
        let mut t = Instant::now();
        let mut c = Controller::new(&p, t);
        // iodepth 64: one loop serves more (400k against 310k).
        let rate = |p: &Placement| if p.paused() == 1 { 400_000 } else { 310_000 };
        drive(&p, &mut c, &mut t, 2, rate);
        assert_eq!(p.paused(), 1, "{p:?}");
        assert!(c.stats().kept >= 1);
        // The trials that take it back are undone while that serves less.
        let kept = c.stats().kept;
        drive(&p, &mut c, &mut t, 8, rate);
        assert_eq!(p.paused(), 1);
        assert!(c.stats().trials > c.stats().kept);
        assert_eq!(c.stats().kept, kept, "nothing better was found");
    }

    #[test]
    fn a_workload_that_needs_both_loops_gets_them_back() {
        let p = Placement::new(2);
        p.set_paused(1, true);
        let mut t = Instant::now();
        let mut c = Controller::new(&p, t);
        // iodepth 1: both loops serve 2.5x more.
        let rate = |p: &Placement| if p.paused() == 1 { 40_000 } else { 100_000 };
        drive(&p, &mut c, &mut t, 2, rate);
        assert_eq!(p.paused(), 0);
        drive(&p, &mut c, &mut t, 8, rate);
        assert_eq!(p.paused(), 0, "the trials of pausing one are undone");
        assert!(c.stats().trials >= 3, "{:?}", c.stats());
    }

    #[test]
    fn trials_space_out_while_nothing_changes() {
        let p = Placement::new(2);
        let mut t = Instant::now();
        let mut c = Controller::new(&p, t);
        drive(&p, &mut c, &mut t, 30, |p| {
            if p.paused() == 1 {
                40_000
            } else {
                100_000
            }
        });
        // 0.4 + 0.8 + 1.6 + 3.2 s, then every 3.2 s: about 10 trials in 30 s.
        assert!((8..=12).contains(&c.stats().trials), "{:?}", c.stats());
    }

    #[test]
    fn an_idle_session_has_every_loop_taking_requests() {
        let p = Placement::new(3);
        p.set_paused(0, true);
        p.set_paused(2, true);
        let mut t = Instant::now();
        let mut c = Controller::new(&p, t);
        drive(&p, &mut c, &mut t, 1, |_| 1000);
        assert_eq!(p.paused(), 0);
        assert_eq!(c.stats().trials, 0);
    }

    #[test]
    fn the_last_loop_is_never_paused() {
        let p = Placement::new(2);
        let mut t = Instant::now();
        let mut c = Controller::new(&p, t);
        // Pausing always looks better: still one loop takes requests.
        drive(&p, &mut c, &mut t, 10, |p| {
            100_000 + 50_000 * p.paused() as u64
        });
        assert_eq!(p.paused(), 1);
        assert!(matches!(p.trial_move(&[0, 0]), Some(Move::Resume(_))));
    }

    #[test]
    fn the_most_contended_loop_is_the_one_paused() {
        let p = Placement::new(3);
        assert_eq!(p.trial_move(&[100, 450, 200]), Some(Move::Pause(1)));
        p.set_paused(1, true);
        assert_eq!(p.trial_move(&[100, 0, 200]), Some(Move::Pause(2)));
        p.set_paused(2, true);
        assert_eq!(p.trial_move(&[900, 0, 0]), Some(Move::Resume(1)));
    }
}
