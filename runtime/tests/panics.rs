//! A job's panic as the loop reports it: counted, logged with the coroutine's identity and
//! the panic's message, its joiner told, its worker ended, the loop going on; and shutdown's
//! forced unwind of a worker suspended in its job, which is not a panic of that job.
//!
//! Each worker catches its jobs' panics once, at its entry (`worker`), not the loop around
//! every resume; these pin down that the report stayed what it was, whichever path resumed
//! the coroutine (the general loop, or the fast paths of a lone yielder and I/O waiter).
//! A file of its own: it installs the process's logger, and sorts records by thread.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Mutex;
use std::thread::ThreadId;

mod util;

use runtime::{Config, JoinError, Runtime, WaitQueue};
use util::SetOnDrop;

/// Every error record, with the thread that logged it (tests run on threads of their own).
static RECORDS: Mutex<Vec<(ThreadId, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Error
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let id = std::thread::current().id();
            RECORDS
                .lock()
                .unwrap()
                .push((id, record.args().to_string()));
        }
    }
    fn flush(&self) {}
}

/// The error records this thread logged so far.
fn logged() -> Vec<String> {
    static LOGGER: Capture = Capture;
    let _ = log::set_logger(&LOGGER).map(|()| log::set_max_level(log::LevelFilter::Error));
    let me = std::thread::current().id();
    let records = RECORDS.lock().unwrap();
    records
        .iter()
        .filter(|(id, _)| *id == me)
        .map(|(_, text)| text.clone())
        .collect()
}

fn rt() -> Runtime {
    logged(); // installs the logger before anything can panic
    Runtime::new(Config::default()).expect("io_uring available")
}

#[test]
fn a_panic_is_counted_logged_with_its_identity_and_joined_as_a_panic() {
    let rt = rt();
    let after = Rc::new(Cell::new(false));
    let a = after.clone();
    let (joined, doomed) = rt
        .block_on(move |co| {
            // Joinable: resumed by the general loop (the joiner waits on a queue).
            let doomed = co.spawn_joinable(|co| -> u32 {
                co.yield_now();
                panic!("deliberate {}", 7);
            })?;
            let id = doomed.id();
            let joined = doomed.join(co);
            a.set(true);
            Ok::<_, std::io::Error>((joined, id))
        })
        .unwrap()
        .unwrap();
    assert!(after.get(), "the joiner ran on after the panic");
    assert_eq!(joined, Err(JoinError::Panicked(doomed)));
    let want = format!("coroutine {doomed} (task) panicked: deliberate 7; the loop goes on");
    assert_eq!(logged(), [want]);
    let c = rt.counters();
    assert_eq!((c.panicked, c.completed, c.live), (1, 1, 0));
    // The worker ended: its stack, not the worker, went back to the pool. Of the next two
    // jobs, one gets `block_on`'s idle worker, the other a new worker on that stack.
    assert_eq!(rt.free_stacks(), 2);
    rt.spawn(|co| co.yield_now()).unwrap();
    rt.spawn(|co| co.yield_now()).unwrap();
    rt.run().unwrap();
    let c = rt.counters();
    assert_eq!((c.stacks_allocated, c.workers_reused), (2, 1));
    assert_eq!(c.stacks_reused, 2, "the idle worker and the bare stack");
}

#[test]
fn a_panic_on_either_fast_path_is_reported_the_same_way() {
    let rt = rt();
    // A lone yielder (`run_alone`), then a lone I/O waiter (`wait_alone`).
    rt.spawn_named("yielder", |co| {
        for _ in 0..3 {
            co.yield_now();
        }
        panic!("after yields");
    })
    .unwrap();
    rt.run().unwrap();
    let yielder = rt.counters().spawned;
    rt.spawn_named("waiter", |co| {
        for _ in 0..3 {
            co.ctx().nop().unwrap();
        }
        panic!("{}", String::from("after I/O"));
    })
    .unwrap();
    rt.run().unwrap();
    let waiter = rt.counters().spawned;
    assert_eq!(
        logged(),
        [
            format!("coroutine co#{yielder} (yielder) panicked: after yields; the loop goes on"),
            format!("coroutine co#{waiter} (waiter) panicked: after I/O; the loop goes on"),
        ]
    );
    let c = rt.counters();
    assert_eq!((c.panicked, c.completed, c.live), (2, 0, 0));
    assert_eq!(
        c.resumes,
        c.suspends + 2,
        "each ended once, back to the loop"
    );
    assert_eq!(
        rt.free_stacks(),
        1,
        "each worker's stack went back to the pool"
    );
}

#[test]
fn shutdown_unwinds_a_job_suspended_in_a_worker_without_reporting_a_panic() {
    let rt = rt();
    let unwound = Rc::new(Cell::new(false));
    let queue = Rc::new(WaitQueue::new());
    let (u, q) = (unwound.clone(), queue.clone());
    rt.spawn(move |co| {
        let _guard = SetOnDrop(u);
        q.wait(co); // never woken: shutdown unwinds it from here
        unreachable!("never woken");
    })
    .unwrap();
    // One turn: the coroutine starts and waits on the queue; the loop stops after it.
    rt.run_until(|| true).unwrap();
    assert!(!unwound.get());
    rt.shutdown().unwrap();
    assert!(unwound.get(), "the job's destructors ran");
    assert_eq!(rt.counters().panicked, 0, "a forced unwind is not a panic");
    assert!(logged().is_empty(), "{:?}", logged());
}

#[test]
fn a_stop_that_panics_while_a_lone_yielder_runs_leaves_the_yielder_alive() {
    let rt = rt();
    let unwound = Rc::new(Cell::new(false));
    let u = unwound.clone();
    rt.spawn_named("yielder", move |co| {
        let _guard = SetOnDrop(u);
        loop {
            co.yield_now(); // alone: the loop resumes it in its fast path
        }
    })
    .unwrap();
    let checks = Rc::new(Cell::new(0));
    let c = checks.clone();
    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.run_until(move || {
            c.set(c.get() + 1);
            if c.get() == 10 {
                panic!("stop fails");
            }
            false
        })
    }));
    assert!(stopped.is_err(), "the panic of stop() reached the caller");
    assert!(checks.get() >= 10);
    // The yielder was neither unwound nor counted as panicked by stop()'s panic: it is
    // still in its slot, and shutdown unwinds it as any suspended coroutine.
    assert!(!unwound.get());
    assert_eq!(rt.counters().panicked, 0);
    rt.shutdown().unwrap();
    assert!(unwound.get(), "shutdown unwound it");
    assert_eq!(rt.counters().panicked, 0);
    assert!(logged().is_empty(), "{:?}", logged());
}
