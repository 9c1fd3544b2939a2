//! O_DIRECT without a global lock: a read-modify-write holds only its own blocks, aligned
//! writes never wait for each other and never bounce. Images live in the default temp dir
//! (a real file system here) and on tmpfs where there is one, opened with O_DIRECT only
//! (buffered I/O takes no block locks and never bounces: see `util::direct_matrix`).

mod util;

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::AlignedBuf;
use backend::{BlockBackend, Ctx, FileBackend};
use util::{direct_matrix, pattern, read, Setup};

/// How long a request that should not wait is given before the test calls it stuck. Not a
/// speed check: each of these requests takes microseconds to a few milliseconds.
const STUCK: Duration = Duration::from_secs(20);

/// The unrelated requests: an aligned write, an unaligned write (itself an RMW) and a
/// discard, all in other blocks than the first.
fn unrelated(b: &FileBackend, cx: &Ctx<'_>, which: usize) {
    match which {
        0 => {
            let mut buf = AlignedBuf::zeroed(4096);
            buf.fill(0xA0);
            b.writev(cx, &[IoSlice::new(&buf)], 64 * 1024).unwrap();
        }
        1 => b
            .writev(cx, &[IoSlice::new(&[0xB1; 300])], 8192 + 100)
            .unwrap(),
        _ => b.discard(cx, 128 * 1024, 4096).unwrap(),
    }
}

/// The request that must wait: a write into the held block.
fn related(b: &FileBackend, cx: &Ctx<'_>) {
    b.writev(cx, &[IoSlice::new(&[0xC2; 10])], 200).unwrap();
}

fn check_contents(s: &Setup, b: &FileBackend, cx: &Ctx<'_>) {
    assert_eq!(read(b, cx, 10, 200), [0xC2; 10], "{}", s.label);
    assert_eq!(read(b, cx, 4096, 64 * 1024), [0xA0; 4096], "{}", s.label);
    assert_eq!(read(b, cx, 300, 8192 + 100), [0xB1; 300], "{}", s.label);
    assert_eq!(read(b, cx, 4096, 128 * 1024), [0; 4096], "{}", s.label);
}

#[test]
fn a_stalled_read_modify_write_stalls_only_its_blocks() {
    direct_matrix(
        "a_stalled_read_modify_write_stalls_only_its_blocks",
        |s, cx| {
            let b = s.open(&s.file("stall", &pattern(1 << 20, 3)));
            match cx {
                Ctx::Blocking => stall_with_threads(s, &b),
                Ctx::Coroutine(co) => stall_with_coroutines(s, &b, co),
            }
            check_contents(s, &b, cx);
        },
    );
}

fn stall_with_threads(s: &Setup, b: &Arc<FileBackend>) {
    let held = b.hold_blocks_for_test(&Ctx::Blocking, 0, 100);
    std::thread::scope(|scope| {
        let others: Vec<_> = (0..3)
            .map(|i| scope.spawn(move || unrelated(b, &Ctx::Blocking, i)))
            .collect();
        let started = Instant::now();
        while !others.iter().all(|t| t.is_finished()) {
            assert!(
                started.elapsed() < STUCK,
                "{}: unrelated request stuck",
                s.label
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let waits = b.range_waits();
        let waiter = scope.spawn(move || related(b, &Ctx::Blocking));
        let started = Instant::now();
        while b.range_waits() == waits {
            assert!(!waiter.is_finished(), "{}: wrote into held blocks", s.label);
            assert!(started.elapsed() < STUCK, "{}: never waited", s.label);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!waiter.is_finished(), "{}: wrote into held blocks", s.label);
        drop(held);
        waiter.join().unwrap();
    });
}

fn stall_with_coroutines(s: &Setup, b: &Arc<FileBackend>, co: &runtime::Co<'_>) {
    let held = b.hold_blocks_for_test(&Ctx::Coroutine(co), 0, 100);
    let done: Vec<_> = (0..3)
        .map(|i| {
            let (b, done) = (Arc::clone(b), Arc::new(AtomicBool::new(false)));
            let flag = Arc::clone(&done);
            co.spawn(move |co| {
                unrelated(&b, &Ctx::Coroutine(co), i);
                flag.store(true, Ordering::SeqCst);
            })
            .unwrap();
            done
        })
        .collect();
    let started = Instant::now();
    while !done.iter().all(|d| d.load(Ordering::SeqCst)) {
        assert!(
            started.elapsed() < STUCK,
            "{}: unrelated request stuck",
            s.label
        );
        co.ctx().sleep(Duration::from_millis(1)).unwrap();
    }
    let waits = b.range_waits();
    let b2 = Arc::clone(b);
    let waiter = co
        .spawn_joinable(move |co| related(&b2, &Ctx::Coroutine(co)))
        .unwrap();
    let started = Instant::now();
    while b.range_waits() == waits {
        assert!(!waiter.is_finished(), "{}: wrote into held blocks", s.label);
        assert!(started.elapsed() < STUCK, "{}: never waited", s.label);
        co.ctx().sleep(Duration::from_millis(1)).unwrap();
    }
    assert!(!waiter.is_finished(), "{}: wrote into held blocks", s.label);
    drop(held);
    waiter.join(co).unwrap();
}

const WRITERS: usize = 8;

/// Writer `i`: aligned writes of 4 KiB to 1 MiB from page-aligned memory, all over the
/// first 2 MiB, overlapping the other writers'.
fn aligned_writer(b: &FileBackend, cx: &Ctx<'_>, i: usize) {
    let mut buf = AlignedBuf::zeroed(1 << 20);
    for (n, size) in [4096usize, 65536, 1 << 20, 8192, 512 * 1024]
        .into_iter()
        .enumerate()
    {
        buf[..size].fill((i * 8 + n) as u8);
        let offset = ((i * 7 + n * 3) % 16) as u64 * 65536;
        b.writev(cx, &[IoSlice::new(&buf[..size])], offset).unwrap();
    }
}

#[test]
fn aligned_writes_never_bounce_and_never_wait() {
    direct_matrix("aligned_writes_never_bounce_and_never_wait", |s, cx| {
        let b = s.open(&s.file("aligned", &vec![0u8; 2 << 20]));
        match cx {
            Ctx::Blocking => std::thread::scope(|scope| {
                for i in 0..WRITERS {
                    let b = &b;
                    scope.spawn(move || aligned_writer(b, &Ctx::Blocking, i));
                }
            }),
            Ctx::Coroutine(co) => {
                let handles: Vec<_> = (0..WRITERS)
                    .map(|i| {
                        let b = Arc::clone(&b);
                        co.spawn_joinable(move |co| aligned_writer(&b, &Ctx::Coroutine(co), i))
                            .unwrap()
                    })
                    .collect();
                handles.into_iter().for_each(|h| h.join(co).unwrap());
            }
        }
        assert_eq!(
            (b.bounce_buffers_allocated(), b.range_waits()),
            (0, 0),
            "{}: aligned writes bounced or waited",
            s.label
        );
    });
}
