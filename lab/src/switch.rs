//! The runtime's costs against their floors: switches, spawns, and one io_uring round trip.
//!
//! These are the kernels of `corofuse bench switch` (and of the lab's switch cost,
//! [`crate::env`]), and, re-exported by the `corofuse-benches` crate, of its criterion
//! benches: one copy, so both measure exactly the same code. Each kernel runs a given
//! number of iterations of one operation and returns the elapsed time; setup (rings,
//! stacks, files) happens before the clock starts.
//!
//! | case | what one iteration does |
//! |---|---|
//! | `raw_switch` | corosensei alone: resume + suspend (two one-way switches) |
//! | `runtime_switch` | the same through the runtime: `yield_now` and the loop's resume |
//! | `spawn_pooled` | spawn on a pooled stack, run to completion (batches of 64: one worker runs a batch's jobs back to back, chained) |
//! | `spawn_one` | spawn one, then `run()` until it is done: the loop resumes an idle worker and it suspends back (no chaining) |
//! | `spawn_fresh` | the same with no pool: every coroutine maps a new stack |
//! | `nop_bare` | io_uring NOP pushed, submitted with one `io_uring_enter`, reaped |
//! | `nop_coroutine` | the same from a coroutine: submit, suspend, resume on its CQE |
//! | `nop_bare_lines` | `nop_bare`, then a chain of dependent loads through [`EXTRA_LINES`] lines on as many
//! pages: as many lines as `nop_coroutine` touches beyond `nop_bare`'s (counted with
//! `benches/perf/lines-touched.py`), as scattered, with none of its instructions. What
//! touching them costs after a system call |
//! | `pread_4k` | a blocking 4 KiB `pread` from the page cache, for scale |
//! | `accounting` | what per-request accounting adds to one request: the clock reads of a
//! request with one I/O (4) and the recording of its sample into the opcode's histograms |
//! | `yield_live_100`, `yield_live_10k`, `yield_live_30k`, `yield_live_1m` | one yield round trip
//! with that many coroutines alive, all yielding in turn (scaling: the cost should not grow
//! with them) |
//! | `nop_live_100`, `nop_live_10k`, `nop_live_1m` | one io_uring NOP round trip with that many
//! coroutines alive, each submitting NOP after NOP (the loop submits and reaps them in
//! batches, as it does a daemon's I/O) |
//!
//! | `touch_live_100`, `touch_live_10k`, `touch_live_1m` | the memory floor of the two above, with
//! no coroutine: one load from the top line of each of that many stacks (mapped and
//! staggered as the runtime's), in turn. No design that switches into a stack of its own
//! per coroutine touches less, so this is how flat any such design can scale here |
//!
//! Each stack is two mappings (the stack and its guard page), and `vm.max_map_count` (65530
//! by default) caps a process at about 32k stacks: the `*_live_1m` cases need it raised to
//! [`map_count_needed`] (`corofuse bench switch` does that for the run, as root), and about
//! 4.5 GiB of memory (one touched stack page per coroutine); they are not in the default set.

use std::cell::Cell;
use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult};
use io_uring::{opcode, IoUring};
use runtime::{Config, Runtime};
use serde::Serialize;

use crate::median::{middle, Spread};

/// Every case, in report order.
pub const CASES: &[&str] = &[
    "raw_switch",
    "runtime_switch",
    "spawn_pooled",
    "spawn_one",
    "spawn_fresh",
    "nop_bare",
    "nop_coroutine",
    "nop_bare_lines",
    "pread_4k",
    "accounting",
    "yield_live_100",
    "yield_live_10k",
    "yield_live_30k",
    "yield_live_1m",
    "nop_live_100",
    "nop_live_10k",
    "nop_live_1m",
    "touch_live_100",
    "touch_live_10k",
    "touch_live_1m",
];

/// Cases run when none is named: all but the million-coroutine ones (a minute, 4.5 GiB).
pub fn default_cases() -> Vec<&'static str> {
    CASES
        .iter()
        .copied()
        .filter(|c| !c.ends_with("_live_1m"))
        .collect()
}

/// The `vm.max_map_count` that `live` coroutine stacks need (two mappings each, plus the
/// process's own).
pub fn map_count_needed(live: usize) -> u64 {
    2 * live as u64 + 65_530
}

/// Live coroutines of each `yield_live_*` and `nop_live_*` case.
pub fn live_count(case: &str) -> Option<usize> {
    let count = case
        .strip_prefix("yield_live_")
        .or_else(|| case.strip_prefix("nop_live_"))
        .or_else(|| case.strip_prefix("touch_live_"))?;
    Some(match count {
        "100" => 100,
        "10k" => 10_000,
        "30k" => 30_000,
        "1m" => 1_000_000,
        _ => return None,
    })
}

/// Runs `iters` iterations of `case`; `None` for an unknown case name.
pub fn run_case(case: &str, iters: u64) -> Option<Duration> {
    Some(run_once(case, iters)?.0)
}

/// [`run_case`], with the resident bytes per live coroutine for the `*_live_*` cases.
pub fn run_once(case: &str, iters: u64) -> Option<(Duration, Option<f64>)> {
    let live = |(elapsed, resident): (Duration, f64)| (elapsed, Some(resident));
    Some(match case {
        c if c.starts_with("touch_live_") => live(touch_live(live_count(c)?, iters)),
        c if live_count(c).is_some() => live(live_loop(live_count(c)?, iters, live_op(c))),
        _ => (
            match case {
                "raw_switch" => raw_switch(iters),
                "runtime_switch" => runtime_switch(iters),
                "spawn_pooled" => spawn(iters, Config::default()),
                "spawn_one" => spawn_one(iters),
                "spawn_fresh" => spawn(
                    iters,
                    Config {
                        max_free_stacks: 0,
                        ..Config::default()
                    },
                ),
                "nop_bare" => nop_bare::<0>(iters),
                "nop_bare_lines" => nop_bare::<EXTRA_LINES>(iters),
                "nop_coroutine" => nop_coroutine(iters),
                "pread_4k" => pread_4k(iters),
                "accounting" => accounting(iters),
                _ => return None,
            },
            None,
        ),
    })
}

/// corosensei with nothing around it: one resume and one suspend per iteration.
pub fn raw_switch(iters: u64) -> Duration {
    let mut co: Coroutine<(), (), (), DefaultStack> = Coroutine::new(|yielder, ()| loop {
        yielder.suspend(());
    });
    co.resume(()); // start it, so every timed resume lands in `suspend`
    let start = Instant::now();
    for _ in 0..iters {
        if let CoroutineResult::Return(()) = black_box(co.resume(())) {
            unreachable!();
        }
    }
    let elapsed = start.elapsed();
    // The coroutine never finishes; dropping it unwinds its stack.
    drop(co);
    elapsed
}

/// One coroutine yielding to the loop `iters` times: suspend, run queue, resume.
pub fn runtime_switch(iters: u64) -> Duration {
    let rt = Runtime::new(Config::default()).expect("runtime");
    let elapsed = Rc::new(Cell::new(Duration::ZERO));
    let e = elapsed.clone();
    rt.spawn(move |co| {
        co.yield_now(); // warm: the loop is running and the stack is touched
        let start = Instant::now();
        for _ in 0..iters {
            co.yield_now();
        }
        e.set(start.elapsed());
    })
    .expect("spawn");
    rt.run().expect("run");
    elapsed.get()
}

/// What the coroutines of the `*_live_*` case `case` do.
fn live_op(case: &str) -> LiveOp {
    if case.starts_with("nop_live_") {
        LiveOp::Nop
    } else {
        LiveOp::Yield
    }
}

/// What each coroutine of a `*_live_*` case does in a round.
#[derive(Clone, Copy)]
pub enum LiveOp {
    /// `yield_now`: a switch to the loop and back.
    Yield,
    /// One io_uring NOP: queued, submitted with the others of the turn, reaped, resumed.
    Nop,
}

/// `live` coroutines alive at once, yielding (or submitting NOPs) in turn until `iters`
/// operations in all have run (at least one round). Returns the time of the rounds after
/// the first (which touches every stack), scaled to `iters` operations, and the resident
/// memory each live coroutine added, in bytes: the pages it really touched (its stack, its
/// slots), not the stack reserved for it.
///
/// The clock stops when the last coroutine has done its last operation, and the pool keeps
/// every worker when they end: unmapping a million stacks takes seconds, and is not what a
/// round costs.
pub fn live_loop(live: usize, iters: u64, op: LiveOp) -> (Duration, f64) {
    let rounds = (iters / live as u64).max(1);
    let config = Config {
        max_free_stacks: live,
        ..Config::default()
    };
    let rt = Runtime::new(config).expect("runtime");
    let rss_before = resident_bytes();
    let started = Rc::new(Cell::new(None));
    let finished = Rc::new(Cell::new(None));
    let warm = Rc::new(Cell::new(0usize));
    let done = Rc::new(Cell::new(0usize));
    for _ in 0..live {
        let (started, warm) = (started.clone(), warm.clone());
        let (finished, done) = (finished.clone(), done.clone());
        rt.spawn(move |co| {
            let step = || match op {
                LiveOp::Yield => co.yield_now(),
                LiveOp::Nop => co.ctx().nop().expect("nop"),
            };
            step(); // every coroutine has run once: its stack is touched
            warm.set(warm.get() + 1);
            if warm.get() == live {
                started.set(Some((Instant::now(), resident_bytes())));
            }
            for _ in 0..rounds {
                step();
            }
            done.set(done.get() + 1);
            if done.get() == live {
                finished.set(Some(Instant::now()));
            }
        })
        .expect("spawn (raise vm.max_map_count for more live coroutines)");
    }
    rt.run().expect("run");
    let (start, rss_live) = started.get().expect("every coroutine ran");
    let end: Instant = finished.get().expect("every coroutine finished");
    // Per `iters` iterations, whatever whole rounds ran (criterion asks for any count).
    let elapsed = (end - start).mul_f64(iters as f64 / (rounds * live as u64) as f64);
    let per_coroutine = rss_live.saturating_sub(rss_before) as f64 / live as f64;
    (elapsed, per_coroutine)
}

/// The floor of the `*_live_*` cases: `live` stacks mapped as the runtime maps them
/// (`DEFAULT_STACK_SIZE` and a guard page each, tops staggered by a cache line over 32
/// colours), and one 64-byte line just below each top, the first line a resumed coroutine
/// touches, read in turn in creation order. The addresses come from an array, as the run
/// queue gives the loop its next coroutine, so the loads are independent and the CPU may
/// overlap their misses: no design that switches into a stack per coroutine in turn can
/// touch less. `iters` loads in all (at least one lap after a warm lap). Returns the time,
/// scaled to `iters` loads, and the resident bytes per stack (one page).
pub fn touch_live(live: usize, iters: u64) -> (Duration, f64) {
    const COLORS: usize = 32;
    let rss_before = resident_bytes();
    let stacks: Vec<DefaultStack> = (0..live)
        .map(|_| {
            DefaultStack::new(runtime::DEFAULT_STACK_SIZE)
                .expect("stack (raise vm.max_map_count for more)")
        })
        .collect();
    let lines: Vec<*mut u64> = (0..live)
        .map(|i| (stacks[i].base().get() - (i % COLORS) * 64 - 64) as *mut u64)
        .collect();
    for &line in &lines {
        // SAFETY: the line lies inside its stack's mapping, just below the top, 64-byte
        // aligned (a page-aligned top less whole lines); nothing else uses these stacks.
        unsafe { line.write(1) };
    }
    let rss = resident_bytes();
    let laps = (iters / live as u64).max(1);
    let mut sum = 0u64;
    let start = Instant::now();
    for _ in 0..laps {
        for &line in &lines {
            // SAFETY: as above.
            sum = sum.wrapping_add(unsafe { line.read_volatile() });
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(sum, laps * live as u64);
    let elapsed = elapsed.mul_f64(iters as f64 / (laps * live as u64) as f64);
    let per_stack = rss.saturating_sub(rss_before) as f64 / live as f64;
    (elapsed, per_stack)
}

/// This process's resident memory (`/proc/self/statm`), in bytes.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("rss");
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Spawns `iters` empty coroutines in batches of 64 and runs each batch to completion.
pub fn spawn(iters: u64, config: Config) -> Duration {
    const BATCH: u64 = 64;
    let rt = Runtime::new(config).expect("runtime");
    // Warm the pool (when there is one) to its high-water mark.
    for _ in 0..BATCH {
        rt.spawn(|_| {}).expect("spawn");
    }
    rt.run().expect("run");
    let start = Instant::now();
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        for _ in 0..n {
            rt.spawn(|co| {
                black_box(co);
            })
            .expect("spawn");
        }
        rt.run().expect("run");
        left -= n;
    }
    start.elapsed()
}

/// Spawns `iters` empty coroutines one at a time, each run to completion by its own `run()`.
pub fn spawn_one(iters: u64) -> Duration {
    let rt = Runtime::new(Config::default()).expect("runtime");
    rt.spawn(|_| {}).expect("spawn");
    rt.run().expect("run");
    let start = Instant::now();
    for _ in 0..iters {
        rt.spawn(|co| {
            black_box(co);
        })
        .expect("spawn");
        rt.run().expect("run");
    }
    start.elapsed()
}

/// Cache lines a coroutine NOP round trip touches beyond the bare one's: 34 against 15,
/// counted with `benches/perf/lines-touched.py` (benches/HISTORY.md, "Where the NOP's
/// remaining time goes").
pub const EXTRA_LINES: usize = 19;

/// io_uring without coroutines: push a NOP, `submit_and_wait(1)`, reap it; then follow a
/// chain through `LINES` cache lines, each on a page of its own at its own offset (the
/// coroutine's lines are as scattered: the loop's state, a slot, a stack, the ring) and
/// each holding the address of the next, so each load waits for the one before, as the
/// loop's loads through its pointers do. None for the bare NOP: a constant, so that case
/// compiles to the bare loop alone.
pub fn nop_bare<const LINES: usize>(iters: u64) -> Duration {
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .build(256)
        .expect("io_uring");
    let nop = opcode::Nop::new().build().user_data(7);
    const PAGE: usize = 4096 / 8;
    let mut pages = vec![0usize; LINES * PAGE];
    // Link `i` is `i` pages and `i` lines past the buffer's start: a page of its own, and
    // a cache set of its own, whatever the buffer's alignment.
    let at = |i: usize| i * PAGE + (i % 64) * 8;
    let base = pages.as_mut_ptr() as usize;
    for i in 0..LINES {
        pages[at(i)] = if i + 1 < LINES {
            base + at(i + 1) * 8
        } else {
            0
        };
    }
    let start = Instant::now();
    for _ in 0..iters {
        // SAFETY: a NOP points to no memory.
        unsafe { ring.submission().push(&nop).expect("room") };
        ring.submit_and_wait(1).expect("enter");
        let cqe = ring.completion().next().expect("a completion");
        black_box(cqe.result());
        let mut next = if LINES > 0 { base + at(0) * 8 } else { 0 };
        while next != 0 {
            // SAFETY: every link is the address of an element of `pages` (written above),
            // and the last is 0.
            next = unsafe { std::ptr::read_volatile(next as *const usize) };
        }
    }
    let elapsed = start.elapsed();
    black_box(&pages);
    elapsed
}

/// The same NOP from a coroutine: submit, suspend, loop enters and reaps, resume.
pub fn nop_coroutine(iters: u64) -> Duration {
    let rt = Runtime::new(Config::default()).expect("runtime");
    rt.block_on(move |co| {
        co.ctx().nop().expect("nop");
        let start = Instant::now();
        for _ in 0..iters {
            co.ctx().nop().expect("nop");
        }
        start.elapsed()
    })
    .expect("run")
}

/// A blocking 4 KiB pread from a cached temporary file.
pub fn pread_4k(iters: u64) -> Duration {
    let file = tempfile::tempfile().expect("temp file");
    file.set_len(1 << 20).expect("size");
    let mut buf = [0u8; 4096];
    let fd = file.as_raw_fd();
    let start = Instant::now();
    for i in 0..iters {
        let off = ((i % 256) * 4096) as libc::off_t;
        // SAFETY: `buf` is a valid, writable 4 KiB buffer for the duration of the call.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off) };
        assert_eq!(n, 4096);
    }
    start.elapsed()
}

/// Per-request accounting's own cost: the four clock reads of a request with one I/O
/// (start, I/O submitted, I/O completed, reply) and one sample recorded.
pub fn accounting(iters: u64) -> Duration {
    use transport::accounting::{Accounting, Sample};
    let mut acc = Accounting::default();
    let start = Instant::now();
    for i in 0..iters {
        let t0 = Instant::now();
        let io0 = Instant::now();
        let io = io0.elapsed();
        acc.record(&Sample {
            opcode: 15 + (i % 2) as u32, // READ and WRITE
            wait: Duration::from_nanos(i % 4096),
            io,
            total: t0.elapsed(),
            switches: 4,
            sqes: 2,
            syscalls: 1,
        });
    }
    let elapsed = start.elapsed();
    black_box(acc.report());
    elapsed
}

/// One case's result: the median of several timed runs.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Case name (see the module table).
    pub case: String,
    /// Iterations per timed run.
    pub iters: u64,
    /// Median nanoseconds per iteration over the runs.
    pub ns_per_iter: f64,
    /// Fastest and slowest run, ns per iteration.
    pub min_ns: f64,
    /// Slowest run, ns per iteration.
    pub max_ns: f64,
    /// Every run, ns per iteration, in the order of the rounds.
    pub per_run_ns: Vec<f64>,
    /// Instructions per iteration, when measured under callgrind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<f64>,
    /// `*_live_*` only: resident bytes each live coroutine added (pages touched).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_bytes_per_live: Option<f64>,
}

/// Times `case` `runs` times with `iters` iterations each; keeps the median.
pub fn measure(case: &str, iters: u64, runs: usize) -> Option<CaseResult> {
    measure_rounds(&[(case, iters)], runs)?.pop()
}

/// Times every `(case, iters)` `runs` times, in rounds: each round runs each case once, so a
/// slow moment of this shared machine falls on every case of its round alike, and a ratio
/// of two cases can be taken within each round ([`median_ratio`]). Each round starts one
/// case later than the one before, so no case always follows the same one. The `*_live_*`
/// cases warm up inside each run (their first round is not timed); the others get one short
/// run first. `None` for an unknown case name.
pub fn measure_rounds(cases: &[(&str, u64)], runs: usize) -> Option<Vec<CaseResult>> {
    for &(case, iters) in cases {
        if live_count(case).is_none() {
            run_case(case, iters.min(1000))?; // warm-up
        }
    }
    let mut per_run = vec![Vec::new(); cases.len()];
    let mut resident = vec![None; cases.len()];
    for round in 0..runs.max(1) {
        for i in (0..cases.len()).map(|i| (i + round) % cases.len()) {
            let (case, iters) = cases[i];
            let (elapsed, bytes) = run_once(case, iters)?;
            per_run[i].push(elapsed.as_nanos() as f64 / iters as f64);
            resident[i] = bytes;
        }
    }
    let results = cases.iter().zip(per_run).zip(resident).map(
        |((&(case, iters), per_run_ns), resident_bytes_per_live)| {
            let spread = Spread::of(per_run_ns.iter().copied());
            CaseResult {
                case: case.to_string(),
                iters,
                ns_per_iter: middle(per_run_ns.iter().copied()),
                min_ns: spread.min,
                max_ns: spread.max,
                per_run_ns,
                instructions: None,
                resident_bytes_per_live,
            }
        },
    );
    Some(results.collect())
}

/// The median over rounds of `a`'s time over `b`'s in the same round (both measured by one
/// [`measure_rounds`]).
pub fn median_ratio(a: &CaseResult, b: &CaseResult) -> f64 {
    middle(a.per_run_ns.iter().zip(&b.per_run_ns).map(|(x, y)| x / y))
}

/// Iterations that take roughly similar time for each case.
pub fn default_iters(case: &str) -> u64 {
    match case {
        "raw_switch" | "runtime_switch" => 2_000_000,
        "spawn_pooled" | "spawn_one" => 500_000,
        "spawn_fresh" => 20_000,
        // Ten rounds of a million: the first round after the warm-up costs several times
        // the later ones there (1 round: 525 ns, 9 rounds: 182 ns per yield, measured).
        c if live_count(c) == Some(1_000_000) => 10_000_000,
        // A multiple of every other live count: whole rounds.
        c if live_count(c).is_some() => 3_000_000,
        _ => 100_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(per_run_ns: Vec<f64>) -> CaseResult {
        CaseResult {
            case: "x".into(),
            iters: 1,
            ns_per_iter: 0.0,
            min_ns: 0.0,
            max_ns: 0.0,
            per_run_ns,
            instructions: None,
            resident_bytes_per_live: None,
        }
    }

    #[test]
    fn a_ratio_is_the_median_of_the_ratios_within_rounds() {
        // Round 2 is slow for both: the ratio of medians would be 3/1 = 3, within rounds 2.
        let a = result(vec![2.0, 30.0, 3.0]);
        let b = result(vec![1.0, 30.0, 1.0]);
        assert_eq!(median_ratio(&a, &b), 2.0);
    }

    #[test]
    fn rounds_run_every_case_once_each_and_live_cases_report_their_memory() {
        let cases = [
            ("raw_switch", 1000),
            ("touch_live_100", 1000),
            ("nop_bare", 100),
        ];
        let results = measure_rounds(&cases, 3).expect("known cases");
        assert_eq!(results.len(), 3);
        for (r, (case, iters)) in results.iter().zip(cases) {
            assert_eq!((r.case.as_str(), r.iters), (case, iters));
            assert_eq!(r.per_run_ns.len(), 3);
            assert!(r.min_ns <= r.ns_per_iter && r.ns_per_iter <= r.max_ns);
            assert!(r.per_run_ns.iter().all(|&ns| ns > 0.0));
        }
        let touched = results[1].resident_bytes_per_live.expect("a live case");
        assert!(
            touched >= 4096.0,
            "one touched page per stack, got {touched}"
        );
        assert!(results[0].resident_bytes_per_live.is_none());
        assert!(measure_rounds(&[("no_such_case", 1)], 1).is_none());
    }
}
