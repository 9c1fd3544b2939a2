//! Spawning with one queue and promised workers: starts keep spawn order whether a job is
//! chained onto a finished worker or starts a fresh one; the counters stay exact through a
//! burst with panics; a pool bounded below the queued starts still starts every job.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use runtime::{Co, Config, Runtime, TaskId};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

/// Logs the job's id when it first runs, then yields `yields` times, then (for the jobs
/// spawned from outside) spawns `children` jobs like itself without children.
fn job(starts: &Rc<RefCell<Vec<TaskId>>>, yields: usize, children: usize) -> impl FnOnce(&Co<'_>) {
    let starts = starts.clone();
    move |co| {
        starts.borrow_mut().push(co.id());
        for _ in 0..yields {
            co.yield_now();
        }
        for c in 0..children {
            co.spawn(job(&starts, c % 2, 0)).unwrap();
        }
    }
}

#[test]
fn starts_keep_spawn_order_across_chained_and_fresh_workers() {
    let rt = rt();
    let starts = Rc::new(RefCell::new(Vec::new()));
    let mut spawned = Vec::new();
    for round in 0..3 {
        // Bursts mixing jobs that finish at once (the next start chains onto their worker)
        // with jobs that yield (the next start needs another worker, pooled or new).
        for i in 0..100 {
            let yields = if (i + round) % 4 == 0 { 1 + i % 3 } else { 0 };
            spawned.push(rt.spawn(job(&starts, yields, i % 3)).unwrap());
        }
        rt.run().unwrap();
    }
    let starts = starts.borrow();
    let children: usize = 3 * (0..100).map(|i| i % 3).sum::<usize>();
    assert_eq!(starts.len(), 300 + children, "every job ran once");
    assert!(
        starts.windows(2).all(|w| w[0] < w[1]),
        "jobs start in spawn order (ids count spawns)"
    );
    assert!(spawned.iter().all(|id| starts.contains(id)));
    let c = rt.counters();
    assert!(c.chained > 100, "chained starts: {}", c.chained);
    assert!(
        c.stacks_allocated > 10,
        "fresh workers: {}",
        c.stacks_allocated
    );
    assert!(c.workers_reused > 0, "pooled workers: {}", c.workers_reused);
}

#[test]
fn counters_are_exact_after_a_burst_with_panics() {
    let rt = rt();
    let (mut panics, mut children) = (0, 0);
    for i in 0..600u64 {
        let panics_here = i % 5 == 0;
        let spawns = (i % 7 == 0) as u64;
        panics += panics_here as u64;
        children += spawns;
        rt.spawn(move |co| {
            if i % 3 == 0 {
                co.yield_now();
            }
            for _ in 0..spawns {
                co.spawn(|co| co.yield_now()).unwrap();
            }
            if panics_here {
                panic!("job {i}");
            }
        })
        .unwrap();
    }
    rt.run().unwrap();
    let c = rt.counters();
    assert_eq!(c.spawned, 600 + children);
    assert_eq!((c.panicked, c.completed), (panics, 600 + children - panics));
    assert_eq!((c.live, c.peak_live), (0, 600));
    // Every finish either chains the next start (no switch) or returns to the loop, and
    // every resume comes back once: by a suspend, an end or a panic.
    assert_eq!(c.resumes, c.suspends + c.completed + c.panicked - c.chained);
    assert_eq!(c.switches, c.resumes + c.suspends + c.spawned - c.chained);
    // Every spawn took a promised idle worker or made one, on a bare or fresh stack.
    let bare = c.stacks_reused - c.workers_reused;
    assert_eq!(c.workers_reused + bare + c.stacks_allocated, c.spawned);
    assert_eq!(c.jobs_boxed, 0);
    // Nothing queued: the pool holds every stack ever mapped (under the default bound).
    assert_eq!(rt.free_stacks() as u64, c.stacks_allocated);
}

#[test]
fn a_pool_bounded_below_the_queued_starts_still_starts_every_job() {
    let rt = Runtime::new(Config {
        max_free_stacks: 0,
        ..Config::default()
    })
    .expect("io_uring available");
    let ran = Rc::new(Cell::new(0));
    for i in 0..50 {
        let ran = ran.clone();
        // Workers retire (and the pool, bounded at zero, ends them) while starts promised
        // to idle workers wait in the queue: a promised worker is never ended.
        rt.spawn(move |co| {
            if i % 2 == 0 {
                co.yield_now();
            }
            let ran2 = ran.clone();
            co.spawn(move |_| ran2.set(ran2.get() + 1)).unwrap();
            ran.set(ran.get() + 1);
        })
        .unwrap();
    }
    rt.run().unwrap();
    assert_eq!(ran.get(), 100);
    let c = rt.counters();
    assert_eq!((c.spawned, c.completed, c.live), (100, 100, 0));
    assert_eq!(rt.free_stacks(), 0);
}

#[test]
fn spawns_are_refused_once_shutdown_begins_even_with_spare_workers() {
    let rt = rt();
    for _ in 0..4 {
        rt.spawn(|co| co.yield_now()).unwrap();
    }
    rt.run().unwrap();
    assert_eq!(rt.free_stacks(), 4, "spare idle workers");
    // A coroutine waiting at shutdown tries to spawn while it is unwound.
    struct SpawnOnDrop<'a, 'b>(&'a Co<'b>, Rc<Cell<Option<i32>>>);
    impl Drop for SpawnOnDrop<'_, '_> {
        fn drop(&mut self) {
            let refused = self.0.spawn(|_| {}).err();
            self.1.set(refused.and_then(|e| e.raw_os_error()));
        }
    }
    let refused = Rc::new(Cell::new(None));
    let r = refused.clone();
    rt.spawn(move |co| {
        let _spawn = SpawnOnDrop(co, r);
        co.wait_woken();
        unreachable!("never woken");
    })
    .unwrap();
    let mut turns = 0;
    rt.run_until(|| {
        turns += 1;
        turns == 1
    })
    .unwrap();
    assert_eq!(rt.free_stacks(), 3);
    rt.shutdown().unwrap();
    assert_eq!(refused.get(), Some(libc::ECANCELED));
    let after = rt.spawn(|_| {}).unwrap_err();
    assert_eq!(after.raw_os_error(), Some(libc::ECANCELED));
    assert_eq!(rt.counters().spawned, 5);
}

#[test]
fn chained_and_live_are_exact_while_starts_wait_and_after_shutdown_drops_them() {
    let rt = rt();
    let seen = Rc::new(RefCell::new(Vec::new()));
    for _ in 0..4 {
        let seen = seen.clone();
        rt.spawn(move |co| {
            let c = co.counters();
            seen.borrow_mut().push((c.chained, c.live));
        })
        .unwrap();
    }
    let c = rt.counters();
    assert_eq!(
        (c.spawned, c.chained, c.live),
        (4, 0, 4),
        "queued, none begun"
    );
    rt.run().unwrap();
    // The loop started the first job; each of the others chained onto its worker.
    assert_eq!(*seen.borrow(), [(0, 4), (1, 3), (2, 2), (3, 1)]);
    for _ in 0..3 {
        rt.spawn(|_| unreachable!("dropped unrun")).unwrap();
    }
    rt.shutdown().unwrap();
    let c = rt.counters();
    assert_eq!((c.spawned, c.completed, c.chained), (7, 4, 3));
    assert_eq!(c.live, 3, "jobs dropped unrun at shutdown never finished");
}
