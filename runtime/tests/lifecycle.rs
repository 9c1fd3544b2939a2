//! Stacks, counters, panics and shutdown: the runtime's promises about resources.

use std::cell::Cell;
use std::rc::Rc;

mod util;

use util::SetOnDrop;

use runtime::{Config, CounterSnapshot, Runtime, DEFAULT_STACK_SIZE};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

#[test]
fn counters_match_a_hand_computed_scenario() {
    let rt = rt();
    // Coroutine A: one NOP, one yield, then returns.   resumes 3, suspends 2, 1 SQE.
    // Coroutine B: two NOPs, then panics.               resumes 3, suspends 2, 2 SQEs.
    rt.spawn(|co| {
        co.ctx().nop().unwrap();
        co.yield_now();
    })
    .unwrap();
    rt.spawn(|co| {
        co.ctx().nop().unwrap();
        co.ctx().nop().unwrap();
        panic!("counted panic");
    })
    .unwrap();
    rt.run().unwrap();
    let c = rt.counters();
    let expected = CounterSnapshot {
        spawned: 2,
        completed: 1,
        panicked: 1,
        live: 0,
        peak_live: 2,
        stacks_allocated: 2,
        stacks_reused: 0,
        workers_reused: 0,
        chained: 0,
        jobs_boxed: 0,
        resumes: 6,
        suspends: 4,
        switches: 6 + 4 + 2,
        sqes_submitted: 3,
        // Turn 1: A and B submit a NOP each -> one enter for both (batched).
        // Turn 2: A yields, B submits its second NOP -> one enter.
        // Turn 3: A finishes; B's NOP is already reaped, B panics. No enter needed.
        enter_calls: 2,
        cqes_reaped: 3,
        poll_hits: 0,
        poll_misses: 0,
    };
    assert_eq!(c, expected);
}

#[test]
fn panics_are_contained_and_the_loop_keeps_running() {
    let rt = rt();
    let survivors = Rc::new(Cell::new(0));
    for i in 0..10 {
        let survivors = survivors.clone();
        rt.spawn_named("worker", move |co| {
            co.ctx().nop().unwrap();
            if i % 3 == 0 {
                panic!("worker {i} fails");
            }
            co.yield_now();
            survivors.set(survivors.get() + 1);
        })
        .unwrap();
    }
    rt.run().unwrap();
    assert_eq!(survivors.get(), 6);
    let c = rt.counters();
    assert_eq!((c.panicked, c.completed, c.live), (4, 6, 0));
    // A panicking coroutine's stack goes back to the pool like any other.
    assert_eq!(rt.free_stacks() as u64, c.stacks_allocated);
    // The runtime still works afterwards.
    assert!(rt.block_on(|co| co.ctx().nop().is_ok()).unwrap());
}

#[test]
fn a_panic_while_printing_a_backtrace_fits_the_default_stack() {
    std::env::set_var("RUST_BACKTRACE", "1");
    let rt = rt();
    let err = rt
        .block_on(|_| -> () { panic!("with backtrace") })
        .unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
}

#[test]
fn stacks_stay_at_the_high_water_mark_across_100_000_spawns() {
    let rt = rt();
    const BATCH: u64 = 64;
    for _ in 0..(100_000 / BATCH) {
        for _ in 0..BATCH {
            rt.spawn(|co| co.yield_now()).unwrap();
        }
        rt.run().unwrap();
    }
    let c = rt.counters();
    assert_eq!(c.spawned, 100_000 / BATCH * BATCH);
    assert_eq!(
        c.stacks_allocated, BATCH,
        "only the first batch maps stacks"
    );
    assert_eq!(c.stacks_reused, c.spawned - BATCH);
    assert_eq!(c.peak_live, BATCH);
}

#[test]
fn the_pool_keeps_at_most_max_free_stacks() {
    let rt = Runtime::new(Config {
        max_free_stacks: 4,
        ..Config::default()
    })
    .unwrap();
    for _ in 0..10 {
        rt.spawn(|co| co.yield_now()).unwrap();
    }
    rt.run().unwrap();
    assert_eq!(rt.free_stacks(), 4);
}

/// Recurses until `target` bytes of stack lie between `top` and the current frame, then
/// submits I/O from there; returns the depth reached.
fn descend(co: &runtime::Co<'_>, top: usize, target: usize, depth: usize) -> usize {
    let frame = std::hint::black_box([depth as u8; 512]);
    let here = frame.as_ptr() as usize;
    if top - here >= target {
        nop_at_the_bottom(co);
        return depth;
    }
    let deeper = descend(co, top, target, depth + 1);
    std::hint::black_box(frame);
    deeper
}

/// The I/O of [`descend`], out of line: its locals stay out of every recursive frame.
#[inline(never)]
fn nop_at_the_bottom(co: &runtime::Co<'_>) {
    co.ctx().nop().unwrap();
}

#[test]
fn a_coroutine_can_use_most_of_its_stack() {
    let rt = rt();
    // 220 KiB of the 256 KiB default, measured by frame addresses, with I/O at the bottom.
    let target = 220 * 1024;
    assert!(target < DEFAULT_STACK_SIZE);
    let depth = rt
        .block_on(move |co| {
            let top = std::hint::black_box(0u8);
            descend(co, &top as *const u8 as usize, target, 0)
        })
        .unwrap();
    assert!(depth > 100, "recursed {depth} frames");
}

/// Drives the loop until everything spawned so far has submitted its first SQE: a marker
/// coroutine spawned last completes one NOP, which is submitted in the same batch.
fn run_until_submitted(rt: &Runtime) {
    let marked = Rc::new(Cell::new(false));
    let m = marked.clone();
    rt.spawn(move |co| {
        co.ctx().nop().unwrap();
        m.set(true);
    })
    .unwrap();
    rt.run_until(|| marked.get()).unwrap();
}

#[test]
fn shutdown_cancels_in_flight_io_before_freeing_stacks() {
    let (reader, writer) = std::io::pipe().unwrap();
    let reader = Rc::new(reader);
    let unwound = Rc::new(Cell::new(false));
    let io_after_cancel = Rc::new(Cell::new(None));
    let rt = rt();
    {
        let (reader, unwound, io_after) =
            (reader.clone(), unwound.clone(), io_after_cancel.clone());
        rt.spawn(move |co| {
            let _guard = SetOnDrop(unwound);
            struct TryIoOnDrop<'a, 'b>(&'a runtime::Co<'b>, Rc<Cell<Option<i32>>>);
            impl Drop for TryIoOnDrop<'_, '_> {
                fn drop(&mut self) {
                    let err = self.0.ctx().nop().unwrap_err();
                    self.1.set(err.raw_os_error());
                }
            }
            let _try_io = TryIoOnDrop(co, io_after);
            // The buffer lives on this stack; nothing will ever be written to the pipe.
            let mut buf = [0u8; 64];
            let _ = co.ctx().read(&*reader, &mut buf);
            unreachable!("the read never completes normally");
        })
        .unwrap();
    }
    run_until_submitted(&rt);
    assert_eq!(rt.counters().sqes_submitted, 2);
    assert!(!unwound.get());
    rt.shutdown().unwrap();
    assert!(unwound.get(), "the suspended coroutine was unwound");
    assert_eq!(io_after_cancel.get(), Some(libc::ECANCELED));
    let c = rt.counters();
    assert_eq!(
        c.cqes_reaped, 3,
        "the marker NOP, the read and the cancel were all reaped"
    );
    drop(writer);
    // Spawning after shutdown is refused.
    assert_eq!(
        rt.spawn(|_| {}).unwrap_err().raw_os_error(),
        Some(libc::ECANCELED)
    );
}

#[test]
fn dropping_the_runtime_with_sleepers_returns_promptly() {
    let rt = rt();
    for _ in 0..100 {
        rt.spawn(|co| {
            let _ = co.ctx().sleep(std::time::Duration::from_secs(3600));
        })
        .unwrap();
    }
    run_until_submitted(&rt);
    let start = std::time::Instant::now();
    drop(rt);
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn each_coroutine_counts_its_own_suspends_sqes_and_io_time() {
    let rt = Runtime::new(Config {
        account: true,
        ..Config::default()
    })
    .unwrap();
    let stats = rt
        .block_on(|co| {
            co.ctx().nop().unwrap();
            co.yield_now();
            co.ctx()
                .sleep(std::time::Duration::from_millis(20))
                .unwrap();
            assert!(
                co.reaped_at().is_some(),
                "a reap happened before this resume"
            );
            co.stats()
        })
        .unwrap();
    assert_eq!((stats.suspends, stats.sqes), (3, 2));
    assert!(
        stats.io_wait >= std::time::Duration::from_millis(20),
        "{stats:?}"
    );
    // Without accounting the counts remain, the clock is never read.
    let plain = rt_plain_stats();
    assert_eq!((plain.suspends, plain.sqes), (1, 1));
    assert_eq!(plain.io_wait, std::time::Duration::ZERO);
}

fn rt_plain_stats() -> runtime::CoStats {
    let rt = rt();
    rt.block_on(|co| {
        co.ctx().nop().unwrap();
        assert!(co.reaped_at().is_none());
        co.stats()
    })
    .unwrap()
}
