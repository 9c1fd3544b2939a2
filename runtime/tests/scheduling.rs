//! Scheduling: run order, wait queues, locks, joins, deadlock detection.

use std::cell::RefCell;
use std::rc::Rc;

use runtime::{CoMutex, CoRwLock, Config, JoinError, Runtime, WaitQueue};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

#[test]
fn ready_coroutines_run_in_fifo_order_round_robin() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    for name in ["a", "b", "c"] {
        let log = log.clone();
        rt.spawn(move |co| {
            for round in 1..=3 {
                log.borrow_mut().push(format!("{name}{round}"));
                co.yield_now();
            }
        })
        .unwrap();
    }
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]
    );
}

#[test]
fn spawned_coroutine_runs_after_its_parent_suspends() {
    let rt = rt();
    let log = Rc::new(RefCell::new(Vec::new()));
    let l = log.clone();
    rt.spawn(move |co| {
        let child_log = l.clone();
        co.spawn(move |_| child_log.borrow_mut().push("child"))
            .unwrap();
        l.borrow_mut().push("parent before yield");
        co.yield_now();
        l.borrow_mut().push("parent after yield");
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        ["parent before yield", "child", "parent after yield"]
    );
}

#[test]
fn local_waker_wakes_on_its_own_loop_only() {
    let other = rt();
    let rt = rt();
    let foreign = other.block_on(|co| co.local_waker()).unwrap();
    let slot = Rc::new(RefCell::new(None));
    let log = Rc::new(RefCell::new(Vec::new()));
    let (s, l) = (slot.clone(), log.clone());
    rt.spawn(move |co| {
        *s.borrow_mut() = Some(co.local_waker());
        co.wait_woken();
        l.borrow_mut().push("woken");
    })
    .unwrap();
    let l = log.clone();
    rt.spawn(move |co| {
        let waker = slot.borrow_mut().take().expect("the waiter ran first");
        assert_eq!(waker.loop_id(), co.loop_id());
        assert_ne!(foreign.loop_id(), co.loop_id());
        assert!(
            !co.wake_local(foreign),
            "another loop's coroutine is not ours"
        );
        l.borrow_mut().push("waking");
        assert!(co.wake_local(waker));
        assert!(!co.wake_local(waker), "already ready: not woken twice");
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(*log.borrow(), ["waking", "woken"]);
}

#[test]
fn wait_queue_wakes_in_fifo_order() {
    let rt = rt();
    let queue = Rc::new(WaitQueue::new());
    let log = Rc::new(RefCell::new(Vec::new()));
    for i in 0..3 {
        let (queue, log) = (queue.clone(), log.clone());
        rt.spawn(move |co| {
            queue.wait(co);
            log.borrow_mut().push(i);
        })
        .unwrap();
    }
    let q = queue.clone();
    rt.spawn(move |co| {
        co.yield_now(); // let the three waiters park first
        assert_eq!(q.wake_all(co), 3);
        assert!(q.is_empty());
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(*log.borrow(), [0, 1, 2]);
}

#[test]
fn mutex_excludes_across_suspension_and_hands_off_fifo() {
    let rt = rt();
    let mutex = Rc::new(CoMutex::new(Vec::new()));
    for i in 0..4 {
        let mutex = mutex.clone();
        rt.spawn(move |co| {
            let mut guard = mutex.lock(co);
            guard.push(format!("{i} in"));
            co.ctx().nop().unwrap(); // suspend on the ring while holding the lock
            co.yield_now();
            guard.push(format!("{i} out"));
        })
        .unwrap();
    }
    rt.run().unwrap();
    assert!(!mutex.is_locked());
    let m = mutex.clone();
    let entries = rt.block_on(move |co| m.lock(co).clone()).unwrap();
    let expected: Vec<String> = (0..4)
        .flat_map(|i| [format!("{i} in"), format!("{i} out")])
        .collect();
    assert_eq!(entries, expected);
}

#[test]
fn rwlock_shares_readers_and_prefers_a_waiting_writer() {
    let rt = rt();
    let lock = Rc::new(CoRwLock::new(0u32));
    let log = Rc::new(RefCell::new(Vec::new()));
    let spawn_reader = |name: &'static str| {
        let (lock, log) = (lock.clone(), log.clone());
        rt.spawn(move |co| {
            let value = lock.read(co);
            log.borrow_mut().push(format!("{name} reads {}", *value));
            co.yield_now();
            co.yield_now();
            log.borrow_mut().push(format!("{name} done"));
        })
        .unwrap();
    };
    spawn_reader("r1");
    spawn_reader("r2");
    let (l, g) = (lock.clone(), log.clone());
    rt.spawn(move |co| {
        let mut value = l.write(co);
        *value += 1;
        g.borrow_mut().push("writer".to_string());
    })
    .unwrap();
    spawn_reader("r3"); // arrives while the writer waits: must read the new value
    rt.run().unwrap();
    assert_eq!(
        *log.borrow(),
        [
            "r1 reads 0",
            "r2 reads 0",
            "r1 done",
            "r2 done",
            "writer",
            "r3 reads 1",
            "r3 done"
        ]
    );
}

#[test]
fn join_returns_the_value_or_the_panic() {
    let rt = rt();
    let result = rt
        .block_on(|co| {
            let good = co.spawn_joinable(|co| {
                co.ctx().nop().unwrap();
                7
            })?;
            let bad = co.spawn_joinable(|_| -> u32 { panic!("deliberate") })?;
            let bad_id = bad.id();
            Ok::<_, std::io::Error>((good.join(co), bad.join(co), bad_id))
        })
        .unwrap()
        .unwrap();
    assert_eq!(result.0, Ok(7));
    assert_eq!(result.1, Err(JoinError::Panicked(result.2)));
}

#[test]
fn a_loop_where_nothing_can_run_reports_deadlock() {
    let rt = rt();
    let queue = Rc::new(WaitQueue::new());
    let q = queue.clone();
    rt.spawn(move |co| q.wait(co)).unwrap();
    let err = rt.run().unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
}
