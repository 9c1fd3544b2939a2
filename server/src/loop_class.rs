//! The loops of FUSE over io_uring in the idle scheduling class, and the guard that takes a
//! starved loop back to the normal class.
//!
//! Why the idle class: see `runtime::sched_class` (the client of a ring queue stays on its
//! CPU instead of moving on every request: 3x the IOPS at iodepth 1). Why a guard: a loop
//! in the idle class gets a CPU only when nothing else wants it, so beside a CPU hog it
//! serves almost nothing. The supervisor reads each loop thread's `schedstat` every
//! [`WINDOW`]: a loop that waited long for its CPU each time it got one, or that stayed
//! runnable through two windows without getting one ([`starved`]), goes back to the
//! normal class for a hold ([`HOLD`], doubled each time it starves again, up to
//! [`MAX_HOLD`], and back to [`HOLD`] after [`CLEAN`] without a starvation), then is tried
//! in the idle class again. Serving a client on its own CPU, a loop waits ~1 us per slice
//! (the client runs until its next request); beside a qd64 client ~170 us; beside a hog
//! ~15 ms.
//!
//! A loop beside a deep client is *crowded*: the client keeps its CPU busy, the pinned idle
//! loop serves only while the client waits, and the other CPU idles (one client at
//! iodepth 64: 0.72x of the /dev/fuse default). A crowded loop ([`crowded`]: a fifth of
//! the window waited and more than it ran, [`CROWDED_PER_SLICE`] or more each time) goes
//! to the normal class and *floats* on the CPUs of all the session's loops for [`HOLD`] if
//! those CPUs sat idle [`ROOM`] or more in the window (`cpu_idle`: with a client on every
//! CPU there is no room, and floating costs: 2 jobs at iodepth 64, 0.89x), then is pinned
//! and idle again to measure anew (the hold does not grow: a client that drops to iodepth
//! 1 wants the pinned idle loop back soon). The kernel still queues the client's requests
//! on its CPU's queue, but that queue's loop now runs where there is room.
//!
//! Threads a loop starts inherit its class (the kernel's io_uring workers for I/O it hands
//! off, a backend's helper threads): each window the guard also puts every other thread of
//! the process it finds in the idle class back in the normal one.
//!
//! A loop goes idle only if a thread of the process could leave the class again
//! (`runtime::sched_class::can_leave_idle`), and goes back to the normal class when the
//! session's part on it ends, and when the guard is dropped. The class is the thread's: on
//! a loop set shared by several sessions, a ring session's idle class holds for the others
//! on the same loops while it serves (only ring sessions choose it).

use std::time::{Duration, Instant};

use runtime::affinity::CpuSet;
use runtime::sched_class::{set_idle, Threads};
use transport::placement::{Reading, ThreadClock, Waits};

use crate::cpu_idle::CpuIdle;

/// How often the guard looks at the loops.
pub const WINDOW: Duration = Duration::from_millis(50);
/// A window in which a loop waited at least this long in all ...
pub const STARVED_WAIT: Duration = Duration::from_millis(5);
/// ... and this long on average each time before it got its CPU, is starved.
pub const STARVED_PER_SLICE: Duration = Duration::from_micros(500);
/// A window in which a loop waited at least this long in all, and longer than it ran ...
pub const CROWDED_WAIT: Duration = Duration::from_millis(10);
/// ... and this long on average each time before it got its CPU, is crowded (beside one
/// deep client on null: 11-28 ms waited, 200-300 us a slice, 6-9 ms run; serving an
/// iodepth-1 client on its CPU: ~1 us a slice; beside a disk-bound qd64 writer and a qd1
/// reader: 5-12 ms waited, about as long as it ran).
pub const CROWDED_PER_SLICE: Duration = Duration::from_micros(50);
/// A crowded loop floats only if the loops' CPUs sat idle this long in the window, summed.
pub const ROOM: Duration = Duration::from_millis(20);
/// So is a loop found runnable, without a moment on a CPU, this many windows in a row (the
/// kernel counts a wait only when it ends).
pub const STUCK_WINDOWS: u32 = 2;
/// The first time a starved loop spends in the normal class.
pub const HOLD: Duration = Duration::from_secs(1);
/// The longest.
pub const MAX_HOLD: Duration = Duration::from_secs(16);
/// Back in the idle class this long without starving, the hold starts over at [`HOLD`].
pub const CLEAN: Duration = Duration::from_secs(32);

/// Whether a loop in the idle class that waited `waits` is starved (by its waits alone).
pub fn starved(waits: Waits) -> bool {
    waits.waited >= STARVED_WAIT
        && waits.waited.as_nanos() >= STARVED_PER_SLICE.as_nanos() * u128::from(waits.slices.max(1))
}

/// Whether a loop in the idle class that waited `waits` is crowded: it would serve more
/// floating in the normal class. A loop that runs as long as it waits is not: its client
/// waits on something else (a disk), and the normal class would cost an iodepth-1 client
/// beside it its CPU (floating that loop halved a qd1 reader's IOPS beside a qd64 writer on
/// ext4 `--direct`).
pub fn crowded(waits: Waits) -> bool {
    waits.waited >= CROWDED_WAIT
        && waits.waited >= waits.ran
        && waits.waited.as_nanos() >= CROWDED_PER_SLICE.as_nanos() * u128::from(waits.slices.max(1))
}

/// Why a loop left the idle class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lift {
    /// Other work starved it: normal class for a hold that doubles.
    Starved,
    /// A deep client crowded it: normal class, floating, for [`HOLD`].
    Crowded,
}

/// A thread's state from its `stat` (opened once, read with one `pread` each time, into a
/// buffer on the stack: the guard allocates nothing while it watches).
struct ThreadState {
    file: std::fs::File,
}

impl ThreadState {
    fn of_thread(tid: libc::pid_t) -> std::io::Result<ThreadState> {
        std::fs::File::open(format!("/proc/self/task/{tid}/stat")).map(|file| ThreadState { file })
    }

    /// Whether the thread is runnable (state `R`).
    fn runnable(&self) -> bool {
        use std::os::unix::fs::FileExt;
        let mut text = [0u8; 512];
        let Ok(n) = self.file.read_at(&mut text, 0) else {
            return false;
        };
        runnable_in(&text[..n])
    }
}

/// Whether a `stat` line says runnable: its state follows the command's closing parenthesis.
fn runnable_in(stat: &[u8]) -> bool {
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    stat[close + 1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'R')
}

/// One guarded loop thread.
struct Guarded {
    tid: libc::pid_t,
    clock: ThreadClock,
    state: ThreadState,
    last: Reading,
    /// `Some(until)` while in the normal class.
    normal_until: Option<Instant>,
    /// The CPUs it was pinned to when the guard began.
    home: CpuSet,
    hold: Duration,
    /// When it last went (back) into the idle class.
    idle_since: Instant,
    /// Windows in a row found runnable without CPU time.
    stuck: u32,
    /// Whether it starved before (the first time is logged at info level).
    starved_before: bool,
    /// How many times it floated (the first time is logged at info level).
    floats: u64,
}

/// The guard of one session's loops.
pub struct ClassGuard {
    loops: Vec<Guarded>,
    /// The CPUs of all the loops: where a crowded loop floats.
    float: CpuSet,
    /// Their idle time (`None`: unreadable, and crowded loops stay).
    idle: Option<CpuIdle>,
    threads: Option<Threads>,
    next: Instant,
}

impl ClassGuard {
    /// A guard of the loop threads `tids`, which are in the idle class now.
    pub fn new(tids: &[libc::pid_t], now: Instant) -> ClassGuard {
        let loops = tids
            .iter()
            .filter_map(|&tid| {
                let clock = ThreadClock::of_thread(tid as u32)
                    .and_then(|c| c.read().map(|r| (c, r)))
                    .and_then(|(c, r)| ThreadState::of_thread(tid).map(|s| (c, r, s)))
                    .and_then(|(c, r, s)| CpuSet::of_thread(tid).map(|h| (c, r, s, h)))
                    .inspect_err(|e| {
                        log::warn!(
                            "loop thread {tid}: no scheduler clock ({e}): back to the normal class"
                        );
                        let _ = set_idle(tid, false);
                    })
                    .ok()?;
                Some(Guarded {
                    tid,
                    clock: clock.0,
                    last: clock.1,
                    state: clock.2,
                    home: clock.3,
                    normal_until: None,
                    hold: HOLD,
                    idle_since: now,
                    stuck: 0,
                    starved_before: false,
                    floats: 0,
                })
            })
            .collect::<Vec<Guarded>>();
        let float = loops
            .iter()
            .fold(CpuSet::empty(), |all, g| all.union(&g.home));
        ClassGuard {
            idle: CpuIdle::open(float)
                .inspect_err(|e| log::warn!("/proc/stat: {e}: crowded loops do not float"))
                .ok(),
            float,
            loops,
            threads: Threads::open()
                .inspect_err(|e| {
                    log::warn!("/proc/self/task: {e}: threads the loops start keep their class")
                })
                .ok(),
            next: now + WINDOW,
        }
    }

    /// Looks at the loops if a window has passed; returns when to call again.
    pub fn tick(&mut self, now: Instant) -> Instant {
        if now < self.next {
            return self.next;
        }
        self.next = now + WINDOW;
        let room = self
            .idle
            .as_mut()
            .and_then(|idle| idle.since_last().ok())
            .unwrap_or_default();
        for g in &mut self.loops {
            let Ok(reading) = g.clock.read() else {
                continue;
            };
            let waits = reading.waits_since(&g.last);
            g.last = reading;
            g.stuck = match waits.ran.is_zero() && g.state.runnable() {
                true => g.stuck + 1,
                false => 0,
            };
            match g.normal_until {
                None if starved(waits) || g.stuck >= STUCK_WINDOWS => {
                    g.leave_idle(Lift::Starved, waits, now, (&self.float, room));
                }
                None if crowded(waits) && room >= ROOM => {
                    g.leave_idle(Lift::Crowded, waits, now, (&self.float, room));
                }
                None if now.duration_since(g.idle_since) >= CLEAN => g.hold = HOLD,
                None => {}
                Some(until) if now >= until && g.go_home() && set_idle(g.tid, true).is_ok() => {
                    log::debug!("loop thread {}: back in the idle class", g.tid);
                    g.normal_until = None;
                    g.idle_since = now;
                }
                Some(_) => {}
            }
        }
        self.adopt_strays();
        self.next
    }

    /// Puts every thread of the process in the idle class that is not a guarded loop back
    /// in the normal class (threads the loops started inherit their class).
    fn adopt_strays(&self) {
        let Some(threads) = &self.threads else {
            return;
        };
        let _ = threads.each(|tid| {
            if !self.loops.iter().any(|g| g.tid == tid)
                && runtime::sched_class::is_idle(tid).unwrap_or(false)
                && set_idle(tid, false).is_ok()
            {
                log::debug!("thread {tid}, started by an idle loop: back in the normal class");
            }
        });
    }
}

impl Guarded {
    /// Takes a starved or crowded loop to the normal class for its hold (floating on
    /// `float` if crowded); if that fails, the next window tries again.
    fn leave_idle(
        &mut self,
        why: Lift,
        waits: Waits,
        now: Instant,
        (float, room): (&CpuSet, Duration),
    ) {
        if let Err(e) = set_idle(self.tid, false) {
            log::warn!(
                "loop thread {}: {} in the idle class, and cannot leave it: {e}",
                self.tid,
                if why == Lift::Starved {
                    "starved"
                } else {
                    "crowded"
                }
            );
            return;
        }
        let hold = match why {
            Lift::Starved => self.hold,
            Lift::Crowded => HOLD,
        };
        let floats = why == Lift::Crowded && *float != self.home;
        if floats {
            if let Err(e) = float.apply(self.tid) {
                log::debug!("loop thread {}: cannot float on {float:?}: {e}", self.tid);
            }
        }
        // The first starvation of a loop, and its first float, are news; the rest is debug.
        let level = match (why, self.starved_before, self.floats > 0) {
            (Lift::Starved, false, _) | (Lift::Crowded, _, false) => log::Level::Info,
            _ => log::Level::Debug,
        };
        log::log!(
            level,
            "loop thread {}: {} in the idle class ({} us waited over {} slices, {} us run, in {} ms{}; its CPUs idle {} ms): normal class{} for {} ms",
            self.tid,
            if why == Lift::Starved { "starved" } else { "crowded" },
            waits.waited.as_micros(),
            waits.slices,
            waits.ran.as_micros(),
            waits.over.as_millis(),
            if self.stuck >= STUCK_WINDOWS { ", runnable without a CPU" } else { "" },
            room.as_millis(),
            if floats { format!(", floating on CPUs {float:?}") } else { String::new() },
            hold.as_millis()
        );
        self.stuck = 0;
        self.normal_until = Some(now + hold);
        self.floats += u64::from(floats);
        if why == Lift::Starved {
            self.starved_before = true;
            self.hold = (self.hold * 2).min(MAX_HOLD);
        }
    }

    /// Pins the loop to its CPUs again (a no-op unless it floated); whether it is there.
    fn go_home(&self) -> bool {
        match self.home.apply(self.tid) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("loop thread {}: cannot pin it again: {e}", self.tid);
                false
            }
        }
    }
}

/// The session is over: every guarded loop back in the normal class (a loop also does
/// this itself when its part ends; a guard that put it back in the idle class just
/// before must not leave it there: loops of a set serve other sessions too).
impl Drop for ClassGuard {
    fn drop(&mut self) {
        for g in &self.loops {
            let _ = g.go_home();
            let _ = set_idle(g.tid, false);
        }
        let floats: u64 = self.loops.iter().map(|g| g.floats).sum();
        if floats > 0 {
            log::debug!("crowded loops floated {floats} times");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(waited_us: u64, slices: u64) -> Waits {
        Waits {
            ran: Duration::from_micros(100),
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
    fn a_loop_beside_a_deep_client_is_crowded_not_starved() {
        // Measured (2026-12-07): one client at iodepth 64, 200-300 us a slice.
        assert!(crowded(waits(15_976, 49)));
        assert!(!starved(waits(15_976, 49)));
        // Beside a disk-bound writer it runs about as long as it waits (the one window in
        // three 5 s runs that crossed the line: 14.6 ms waited, 14.5 ms run).
        let disk = Waits {
            ran: Duration::from_micros(14_450),
            ..waits(12_000, 144)
        };
        assert!(!crowded(disk));
        // At iodepth 1 the client runs until its next request: ~1 us a slice.
        assert!(!crowded(waits(2_500, 2_300)));
        // Long waits, but too few to matter.
        assert!(!crowded(waits(3_000, 10)));
    }

    #[test]
    fn a_loop_beside_a_hog_is_starved() {
        // Measured: ~15 ms per slice, 67 slices a second.
        assert!(starved(waits(45_000, 3)));
        // Long waits, but too little in all to matter yet.
        assert!(!starved(waits(4_000, 2)));
    }

    #[test]
    fn this_thread_is_runnable_and_a_sleeping_one_is_not() {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        assert!(ThreadState::of_thread(me).unwrap().runnable());
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: as above.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
        });
        let state = ThreadState::of_thread(rx.recv().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while state.runnable() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            !state.runnable(),
            "a thread blocked in recv is not runnable"
        );
        done_tx.send(()).unwrap();
        sleeper.join().unwrap();
    }

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert!(runnable_in(b"12 (fuse-loop-0) R 1 2 3"));
        assert!(!runnable_in(b"12 (a) R) S 1 2 3"));
        assert!(!runnable_in(b"12 (x) S 1"));
        assert!(!runnable_in(b""));
    }
}
