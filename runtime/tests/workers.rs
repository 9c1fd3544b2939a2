//! Worker coroutines: a finished coroutine takes its next job in place, and runs the next
//! queued job of the turn itself (chained); panics and shutdown end workers cleanly; the
//! fast paths for a lone yielder and a lone I/O waiter keep FIFO, turns and counters.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

mod util;

use util::SetOnDrop;

use runtime::{Config, Runtime};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

#[test]
fn a_finished_coroutine_takes_the_next_job_in_place() {
    let rt = rt();
    for _ in 0..1000 {
        rt.spawn(|co| co.ctx().nop().unwrap()).unwrap();
        rt.run().unwrap();
    }
    let c = rt.counters();
    assert_eq!((c.spawned, c.completed, c.live), (1000, 1000, 0));
    assert_eq!(c.stacks_allocated, 1, "one worker served every job");
    assert_eq!((c.workers_reused, c.stacks_reused), (999, 999));
    assert_eq!(c.jobs_boxed, 0);
    assert_eq!(rt.free_stacks(), 1);
}

#[test]
fn each_job_starts_with_fresh_counters_name_and_id() {
    let rt = rt();
    let seen = Rc::new(RefCell::new(Vec::new()));
    for (i, name) in ["first", "second", "third"].into_iter().enumerate() {
        let seen = seen.clone();
        rt.spawn_named(name, move |co| {
            let before = co.stats();
            for _ in 0..=i {
                co.ctx().nop().unwrap();
            }
            seen.borrow_mut().push((co.id(), before, co.stats()));
            if i == 1 {
                panic!("the second job's name is in the log");
            }
        })
        .unwrap();
        rt.run().unwrap();
    }
    let seen = seen.borrow();
    let ids: Vec<_> = seen.iter().map(|s| s.0).collect();
    assert!(
        ids[0] < ids[1] && ids[1] < ids[2],
        "ids are never reused: {ids:?}"
    );
    for (i, (_, before, after)) in seen.iter().enumerate() {
        assert_eq!((before.suspends, before.sqes), (0, 0), "job {i}");
        assert_eq!((after.suspends, after.sqes), (i as u32 + 1, i as u32 + 1));
    }
    let c = rt.counters();
    // The first worker served job 1 and died with job 2; job 3 got a new worker on the
    // dead one's stack.
    assert_eq!((c.completed, c.panicked), (2, 1));
    assert_eq!(
        (c.stacks_allocated, c.workers_reused, c.stacks_reused),
        (1, 1, 2)
    );
}

#[test]
fn a_panicking_job_ends_its_worker_not_the_next_job() {
    let rt = rt();
    let ran = Rc::new(Cell::new(0));
    for i in 0..20 {
        let ran = ran.clone();
        rt.spawn(move |co| {
            co.yield_now();
            if i % 2 == 0 {
                panic!("job {i}");
            }
            ran.set(ran.get() + 1);
        })
        .unwrap();
    }
    rt.run().unwrap();
    assert_eq!(ran.get(), 10);
    // 10 idle workers and 10 bare stacks; the next 20 jobs reuse the workers first.
    assert_eq!(rt.free_stacks(), 20);
    for _ in 0..20 {
        rt.spawn(|co| co.yield_now()).unwrap();
    }
    rt.run().unwrap();
    let c = rt.counters();
    assert_eq!(
        (c.stacks_allocated, c.workers_reused, c.stacks_reused),
        (20, 10, 20)
    );
    assert_eq!(rt.free_stacks(), 20);
}

#[test]
fn large_closures_are_boxed_and_counted() {
    let rt = rt();
    let big = [7u8; 256];
    let sum = rt
        .block_on(move |_| big.iter().map(|&b| b as u32).sum::<u32>())
        .unwrap();
    assert_eq!(sum, 7 * 256);
    let small = rt.block_on(|_| 1).unwrap();
    assert_eq!(small, 1);
    assert_eq!(rt.counters().jobs_boxed, 1);
}

#[test]
fn shutdown_drops_unstarted_jobs_and_ends_idle_workers() {
    let rt = rt();
    // Idle workers in the pool.
    for _ in 0..8 {
        rt.spawn(|co| co.yield_now()).unwrap();
    }
    rt.run().unwrap();
    // Jobs promised to idle workers, and to new workers; none ever runs.
    let dropped = Rc::new(Cell::new(false));
    let guard = SetOnDrop(dropped.clone());
    rt.spawn(move |_| drop(guard)).unwrap();
    let flags: Vec<_> = (0..10).map(|_| Rc::new(Cell::new(false))).collect();
    for f in &flags {
        let g = SetOnDrop(f.clone());
        rt.spawn(move |_| drop(g)).unwrap();
    }
    rt.shutdown().unwrap();
    assert!(dropped.get());
    assert!(flags.iter().all(|f| f.get()));
    assert_eq!(rt.free_stacks(), 0);
    drop(rt);
}

#[test]
fn a_lone_yielder_runs_one_turn_per_resume_and_stops_when_asked() {
    let rt = rt();
    let turns = Rc::new(Cell::new(0u32));
    let t = turns.clone();
    rt.spawn(move |co| loop {
        t.set(t.get() + 1);
        co.yield_now();
    })
    .unwrap();
    let mut checks = 0;
    rt.run_until(|| {
        checks += 1;
        turns.get() == 100
    })
    .unwrap();
    assert_eq!(turns.get(), 100);
    assert_eq!(checks, 100, "stop() is checked once after each turn");
    let c = rt.counters();
    assert_eq!((c.resumes, c.suspends, c.live), (100, 100, 1));
    // It was queued again when stopped: the next run resumes it first.
    rt.run_until(|| turns.get() == 101).unwrap();
    assert_eq!(turns.get(), 101);
}

#[test]
fn a_lone_yielder_goes_back_to_the_queue_when_another_is_ready() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    rt.spawn(move |co| {
        for i in 0..3 {
            l.borrow_mut().push(format!("a{i}"));
            co.yield_now();
        }
        let l2 = l.clone();
        co.spawn(move |co| {
            for i in 0..2 {
                l2.borrow_mut().push(format!("b{i}"));
                co.yield_now();
            }
        })
        .unwrap();
        for i in 3..6 {
            l.borrow_mut().push(format!("a{i}"));
            co.yield_now();
        }
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        ["a0", "a1", "a2", "a3", "b0", "a4", "b1", "a5"]
    );
}

#[test]
fn a_lone_io_waiter_is_resumed_by_its_cqe_one_turn_per_wait_and_stops_when_asked() {
    let rt = rt();
    let nops = Rc::new(Cell::new(0u32));
    let n = nops.clone();
    rt.spawn(move |co| loop {
        co.ctx().nop().unwrap();
        n.set(n.get() + 1);
    })
    .unwrap();
    let mut checks = 0;
    rt.run_until(|| {
        checks += 1;
        checks == 101
    })
    .unwrap();
    assert_eq!(nops.get(), 100, "stop() is checked before each wait");
    let c = rt.counters();
    // Each NOP: one SQE, one io_uring_enter, one CQE, a suspend and a resume; the 101st is
    // in flight, its coroutine suspended.
    assert_eq!((c.resumes, c.suspends, c.live), (101, 101, 1));
    assert_eq!(
        (c.sqes_submitted, c.enter_calls, c.cqes_reaped),
        (100, 100, 100)
    );
    // Still waiting when stopped: the next run submits its NOP and resumes it on the CQE.
    rt.run_until(|| nops.get() == 101).unwrap();
    assert_eq!(nops.get(), 101);
}

#[test]
fn a_lone_io_waiter_keeps_fifo_with_yielders_spawns_and_a_second_sqe() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    rt.spawn(move |co| {
        for i in 0..3 {
            co.ctx().nop().unwrap();
            l.borrow_mut().push(format!("a{i}"));
        }
        co.spawn_named("b", logger(&l, "b", 2)).unwrap();
        for i in 3..6 {
            co.ctx().nop().unwrap();
            l.borrow_mut().push(format!("a{i}"));
        }
        // A second waiter with an SQE of its own: both are in flight at once.
        let l2 = l.clone();
        co.spawn(move |co| {
            co.ctx().sleep(std::time::Duration::from_millis(5)).unwrap();
            l2.borrow_mut().push("c".into());
        })
        .unwrap();
        for i in 6..8 {
            co.ctx().nop().unwrap();
            l.borrow_mut().push(format!("a{i}"));
        }
        co.ctx()
            .sleep(std::time::Duration::from_millis(20))
            .unwrap();
        l.borrow_mut().push("a8".into());
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        ["a0", "a1", "a2", "b0", "a3", "b1", "a4", "b2", "a5", "a6", "a7", "c", "a8"]
    );
    let c = rt.counters();
    assert_eq!(c.sqes_submitted, c.cqes_reaped);
    assert_eq!(c.resumes, c.suspends + c.completed - c.chained);
}

#[test]
fn a_coroutine_that_stop_makes_ready_runs_before_the_loop_waits_for_a_lone_waiter() {
    use std::io::Write;
    let rt = Rc::new(rt());
    let (reader, writer) = std::io::pipe().unwrap();
    // The lone waiter: a read that the coroutine `stop()` spawns satisfies at once, unless
    // the loop waits first; then only the watchdog, 10 s later, does.
    let got = Rc::new(Cell::new(0u8));
    let g = got.clone();
    rt.spawn(move |co| {
        let mut byte = [0u8];
        assert_eq!(co.ctx().read(&reader, &mut byte).unwrap(), 1);
        g.set(byte[0]);
    })
    .unwrap();
    let watchdog_end = writer.try_clone().unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(10));
        let _ = (&watchdog_end).write_all(b"w");
    });
    let (r, g) = (Rc::clone(&rt), got.clone());
    let mut writer = Some(writer);
    rt.run_until(move || {
        if let Some(mut w) = writer.take() {
            r.spawn(move |_| w.write_all(b"b").unwrap()).unwrap();
        }
        g.get() != 0
    })
    .unwrap();
    assert_eq!(
        got.get(),
        b'b',
        "the loop waited on the lone reader before running the coroutine stop() spawned"
    );
}

#[test]
fn leaving_the_io_fast_path_on_another_cqe_checks_stop_once_per_wait() {
    let rt = rt();
    let done = Rc::new(Cell::new(false));
    rt.spawn(|co| loop {
        co.ctx().nop().unwrap();
    })
    .unwrap();
    let d = done.clone();
    rt.spawn(move |co| {
        co.ctx().sleep(std::time::Duration::from_millis(2)).unwrap();
        d.set(true);
    })
    .unwrap();
    let mut checks = 0;
    rt.run_until(|| {
        checks += 1;
        done.get()
    })
    .unwrap();
    // Every check but the last is followed by one wait in the kernel, in the fast path or
    // out of it: the timer's CQE sends the NOP loop back to the general loop, which must
    // not check again before the next turn.
    assert_eq!(checks, rt.counters().enter_calls + 1);
}

#[test]
fn a_lone_io_waiter_that_panics_ends_only_its_worker() {
    let rt = rt();
    let after = Rc::new(Cell::new(false));
    let a = after.clone();
    rt.spawn(move |co| {
        for _ in 0..3 {
            co.ctx().nop().unwrap();
        }
        let a = a.clone();
        co.spawn(move |co| {
            co.ctx().nop().unwrap();
            a.set(true);
        })
        .unwrap();
        panic!("panics while the fast path resumed it");
    })
    .unwrap();
    rt.run().unwrap();
    assert!(after.get(), "the loop went on after the panic");
    let c = rt.counters();
    assert_eq!((c.panicked, c.completed, c.live), (1, 1, 0));
    assert_eq!(c.sqes_submitted, c.cqes_reaped);
}

#[test]
fn a_lone_io_waiter_whose_wait_also_reaps_a_cancel_and_the_cancelled_read_still_resumes() {
    let (reader, _writer) = std::io::pipe().unwrap();
    let rt = rt();
    let blocked = rt
        .spawn_joinable(move |co| {
            let mut buf = [0u8; 8];
            co.ctx().read(&reader, &mut buf).unwrap_err().raw_os_error()
        })
        .unwrap();
    let id = blocked.id();
    let nops = rt
        .block_on(move |co| {
            co.ctx().nop().unwrap(); // the reader's SQE is in flight now
                                     // The cancel goes out with the next NOP: one wait reaps the cancel's own CQE,
                                     // the reader's ECANCELED and this NOP, in whatever order the kernel posts them.
            assert!(co.cancel_io(id).unwrap());
            let mut nops = 1;
            for _ in 0..10 {
                co.ctx().nop().unwrap();
                nops += 1;
            }
            (nops, blocked.join(co).unwrap())
        })
        .unwrap();
    assert_eq!(nops, (11, Some(libc::ECANCELED)));
    let c = rt.counters();
    assert_eq!(c.sqes_submitted, c.cqes_reaped);
    assert_eq!(c.live, 0);
}

/// A job that logs `name` at its start and after each of `yields` yields.
fn logger(
    log: &Rc<RefCell<Vec<String>>>,
    name: &'static str,
    yields: usize,
) -> impl FnOnce(&runtime::Co<'_>) + 'static {
    let log = log.clone();
    move |co| {
        log.borrow_mut().push(format!("{name}0"));
        for i in 1..=yields {
            co.yield_now();
            log.borrow_mut().push(format!("{name}{i}"));
        }
    }
}

/// Spawns a [`logger`] job.
fn logged(rt: &Runtime, log: &Rc<RefCell<Vec<String>>>, name: &'static str, yields: usize) {
    rt.spawn_named(name, logger(log, name, yields)).unwrap();
}

#[test]
fn queued_jobs_chain_onto_a_finished_worker_in_fifo_order() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    logged(&rt, &log, "a", 2);
    logged(&rt, &log, "b", 0);
    logged(&rt, &log, "c", 0);
    logged(&rt, &log, "d", 1);
    rt.run().unwrap();
    // The order the loop's turns give, chained or not.
    assert_eq!(*log.borrow(), ["a0", "b0", "c0", "d0", "a1", "d1", "a2"]);
    let c = rt.counters();
    // b's worker ran c and d in place: no switch for their start or for b's and c's end.
    assert_eq!(c.chained, 2);
    assert_eq!((c.resumes, c.suspends, c.completed), (5, 3, 4));
    // Resumes: a three times, b's worker twice. Returns to the loop: a's two yields, d's
    // yield, and two workers' ends.
    assert_eq!(c.switches, 10);
}

#[test]
fn a_job_spawned_during_a_turn_waits_for_the_next_turn() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    rt.spawn(move |co| {
        l.borrow_mut().push("a");
        let l2 = l.clone();
        co.spawn(move |_| l2.borrow_mut().push("spawned by a"))
            .unwrap();
    })
    .unwrap();
    let l = log.clone();
    rt.spawn(move |_| l.borrow_mut().push("b")).unwrap();
    let mut turns = 0;
    let l = log.clone();
    rt.run_until(move || {
        turns += 1;
        if turns == 1 {
            assert_eq!(*l.borrow(), ["a", "b"], "the first turn is a and b only");
        }
        false
    })
    .unwrap();
    assert_eq!(*log.borrow(), ["a", "b", "spawned by a"]);
    assert_eq!(
        rt.counters().chained,
        1,
        "b chained onto a's worker, not the third"
    );
}

#[test]
fn a_chained_job_that_panics_ends_its_worker_and_the_next_job_still_runs() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    logged(&rt, &log, "b", 0);
    rt.spawn_named("c", |_| panic!("c fails")).unwrap();
    logged(&rt, &log, "d", 0);
    rt.run().unwrap();
    assert_eq!(*log.borrow(), ["b0", "d0"]);
    let c = rt.counters();
    assert_eq!((c.completed, c.panicked, c.chained, c.live), (2, 1, 1, 0));
    // d's promised worker ran it; the panicked worker's stack went back to the pool.
    assert!(rt.block_on(|co| co.ctx().nop().is_ok()).unwrap());
}

#[test]
fn idle_workers_left_over_by_chaining_stay_within_the_pool_bound() {
    let rt = Runtime::new(Config {
        max_free_stacks: 2,
        ..Config::default()
    })
    .unwrap();
    let ran = Rc::new(Cell::new(0));
    for _ in 0..10 {
        let ran = ran.clone();
        rt.spawn(move |_| ran.set(ran.get() + 1)).unwrap();
    }
    rt.run().unwrap();
    assert_eq!(ran.get(), 10);
    let c = rt.counters();
    // Each spawn had a worker promised (made at spawn); one worker ran all ten.
    assert_eq!((c.stacks_allocated, c.chained, c.resumes), (10, 9, 1));
    assert_eq!(rt.free_stacks(), 2);
}

#[test]
fn the_first_suspend_hook_runs_once_before_the_suspend_and_only_while_armed() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    rt.block_on(move |co| {
        let hook = |co: &runtime::Co<'_>| {
            l.borrow_mut().push("hook");
            let l2 = l.clone();
            // Spawned before the suspend: it runs while the body waits.
            co.spawn(move |_| l2.borrow_mut().push("spawned by the hook"))
                .unwrap();
        };
        let ((), quick) = co.on_first_suspend(&hook, || l.borrow_mut().push("quick body"));
        assert!(!quick, "a body that never suspends does not run the hook");
        let ((), waited) = co.on_first_suspend(&hook, || {
            l.borrow_mut().push("body");
            co.ctx().nop().unwrap();
            l.borrow_mut().push("after the first wait");
            co.yield_now();
        });
        assert!(waited);
        co.yield_now(); // disarmed: no hook
        l.borrow_mut().push("done");
    })
    .unwrap();
    assert_eq!(
        *log.borrow(),
        [
            "quick body",
            "body",
            "hook",
            "spawned by the hook",
            "after the first wait",
            "done"
        ]
    );
}

#[test]
fn the_first_suspend_hook_is_disarmed_when_its_body_panics() {
    let rt = rt();
    let ran = Rc::new(Cell::new(0));
    let r = ran.clone();
    let after = rt
        .block_on(move |co| {
            let hook = |_: &runtime::Co<'_>| r.set(r.get() + 1);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                co.on_first_suspend(&hook, || panic!("the body fails"))
            }));
            assert!(caught.is_err());
            co.yield_now(); // the hook's borrow has ended: it must not run
            co.ctx().nop().is_ok()
        })
        .unwrap();
    assert!(after);
    assert_eq!(ran.get(), 0);
}
