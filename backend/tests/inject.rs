//! Fault injection around real backends, in both contexts: each operation fails with the
//! rule's errno where the rule says and passes through elsewhere; conditions, delays and
//! counts.

mod util;

use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::inject::{parse, InjectBackend};
use backend::{BlockBackend, Ctx, NullBackend};
use util::{errno, pattern, read, Setup};

const K: u64 = 1024;

fn inject(inner: Arc<dyn BlockBackend>, spec: &str) -> InjectBackend {
    InjectBackend::new(inner, parse(spec).unwrap())
}

fn null(spec: &str) -> InjectBackend {
    inject(Arc::new(NullBackend::new(1 << 20, true)), spec)
}

fn write(b: &dyn BlockBackend, cx: &Ctx<'_>, data: &[u8], offset: u64) -> io::Result<()> {
    b.writev(cx, &[IoSlice::new(data)], offset)
}

/// The errno of `r`, or 0 for success.
fn outcome<T>(r: io::Result<T>) -> i32 {
    r.map_or_else(|e| errno(&e), |_| 0)
}

#[test]
fn every_operation_fails_in_its_range_only() {
    util::each_ctx(|cx| {
        let spec = "read@4K-8K:EIO,write@8K-12K:ENOSPC,discard@12K-16K:EROFS,\
                    zeroes@16K-20K:EDQUOT,resize@2M-:EFBIG,flush:EAGAIN:nth=2";
        let b = null(spec);
        let mut buf = vec![0u8; 4096];
        let mut rd = |off| outcome(b.readv(cx, &mut [io::IoSliceMut::new(&mut buf)], off));
        assert_eq!(
            [rd(0), rd(4 * K), rd(6 * K), rd(8 * K)],
            [0, libc::EIO, libc::EIO, 0]
        );
        let wr = |off| outcome(write(&b, cx, &[1; 4096], off));
        assert_eq!([wr(4 * K), wr(8 * K), wr(12 * K)], [0, libc::ENOSPC, 0]);
        let punch = |off| outcome(b.write_zeroes(cx, off, 4 * K, true));
        let discard = |off| outcome(b.discard(cx, off, 4 * K));
        assert_eq!(
            [punch(8 * K), punch(12 * K), discard(14 * K)],
            [0, libc::EROFS, libc::EROFS]
        );
        let zero = |off| outcome(b.write_zeroes(cx, off, 4 * K, false));
        assert_eq!(
            [zero(12 * K), zero(16 * K), zero(20 * K)],
            [0, libc::EDQUOT, 0]
        );
        // Shrinking to 1.5M and back changes bytes below 2M: allowed; growing to 3M is not.
        let resize = |len| outcome(b.resize(cx, len));
        assert_eq!(
            [resize(1536 * K), resize(1 << 20), resize(3 << 20)],
            [0, 0, libc::EFBIG]
        );
        assert_eq!(b.len(), 1 << 20);
        let flush = || outcome(b.flush(cx));
        assert_eq!([flush(), flush(), flush()], [0, libc::EAGAIN, 0]);
        let stats = b.inject_stats().unwrap();
        assert_eq!(stats.faults, 8);
        let by_op: Vec<(&str, Vec<(String, u64)>)> = stats
            .faults_by_op
            .iter()
            .map(|(op, e)| (op.as_str(), e.clone().into_iter().collect()))
            .collect();
        let e = |name: &str, n| vec![(name.to_owned(), n)];
        assert_eq!(
            by_op,
            [
                ("discard", e("EROFS", 2)),
                ("flush", e("EAGAIN", 1)),
                ("read", e("EIO", 2)),
                ("resize", e("EFBIG", 1)),
                ("write", e("ENOSPC", 1)),
                ("zeroes", e("EDQUOT", 1)),
            ]
        );
        assert_eq!((stats.rules[0].matched, stats.rules[0].fired), (2, 2));
    });
}

/// A fault means the operation did not run: the file keeps its bytes.
#[test]
fn a_failed_write_writes_nothing() {
    util::matrix("inject_failed_write", |setup: &Setup, cx| {
        let before = pattern(64 * K as usize, 1);
        let inner = setup.open(&setup.file("inject", &before));
        let b = inject(inner, "write@16K-20K:EIO,zeroes@32K-36K:ENOSPC");
        let data = pattern(8 * K as usize, 2);
        assert_eq!(errno(&write(&b, cx, &data, 12 * K).unwrap_err()), libc::EIO);
        let zeroed = b.write_zeroes(cx, 30 * K, 4 * K, false).unwrap_err();
        assert_eq!(errno(&zeroed), libc::ENOSPC);
        assert_eq!(read(&b, cx, 64 * K as usize, 0), before);
        write(&b, cx, &data, 40 * K).unwrap();
        let mut after = before.clone();
        after[40 * K as usize..][..data.len()].copy_from_slice(&data);
        assert_eq!(read(&b, cx, 64 * K as usize, 0), after);
    });
}

#[test]
fn after_size_lets_that_many_bytes_succeed() {
    util::each_ctx(|cx| {
        let b = null("write:ENOSPC:after=100K");
        let wr = |len: usize| outcome(write(&b, cx, &vec![0; len], 0));
        // 64K fits, 64K more would not, 32K does, 4K just fits (100K), then 1 byte is too many.
        assert_eq!(
            [wr(65536), wr(65536), wr(32768), wr(4096), wr(1)],
            [0, libc::ENOSPC, 0, 0, libc::ENOSPC]
        );
        // Failed writes give their reservation back.
        let b = inject(
            Arc::new(NullBackend::new(1 << 20, false)),
            "write:ENOSPC:after=8K",
        );
        assert_eq!(outcome(write(&b, cx, &[0; 8192], 0)), libc::EROFS);
        let b2 = null("write:ENOSPC:after=8K");
        assert_eq!(outcome(write(&b2, cx, &[0; 8192], 0)), 0);
        assert_eq!(outcome(write(&b2, cx, &[0; 1], 0)), libc::ENOSPC);
        assert_eq!(b.inject_stats().unwrap().rules[0].fired, 0);
    });
}

#[test]
fn probability_is_reproducible_from_the_seed() {
    let run = |spec: &str| -> Vec<i32> {
        let b = null(spec);
        (0..200).map(|_| outcome(b.flush(&Ctx::Blocking))).collect()
    };
    let a = run("flush:EIO:1/4,seed=7");
    assert_eq!(a, run("flush:EIO:1/4,seed=7"));
    assert_ne!(a, run("flush:EIO:1/4,seed=8"));
    let failed = a.iter().filter(|&&e| e == libc::EIO).count();
    assert!((20..=80).contains(&failed), "{failed} of 200 at 1/4");
    assert!(run("flush:EIO:0/1").iter().all(|&e| e == 0));
    assert!(run("flush:EIO:5/5").iter().all(|&e| e == libc::EIO));
}

#[test]
fn first_fault_wins_and_delays_add_up() {
    util::each_ctx(|cx| {
        let b = null("delay:read:20ms,delay:any@0-4K:10ms,read@0-4K:EIO:once,any:EPERM:once");
        let mut buf = vec![0u8; 4096];
        let started = Instant::now();
        let first = b.readv(cx, &mut [io::IoSliceMut::new(&mut buf)], 0);
        assert!(
            started.elapsed() >= Duration::from_millis(30),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(errno(&first.unwrap_err()), libc::EIO);
        // The EPERM rule did not see that read: it fires on the next operation.
        assert_eq!(outcome(b.flush(cx)), libc::EPERM);
        let started = Instant::now();
        assert_eq!(
            outcome(b.readv(cx, &mut [io::IoSliceMut::new(&mut buf)], 8192)),
            0
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(20)
                && took < Duration::from_millis(30) + Duration::from_secs(1)
        );
        let stats = b.inject_stats().unwrap();
        assert_eq!(
            (stats.faults, stats.delays, stats.delays_by_op["read"]),
            (2, 3, 3)
        );
        assert_eq!(stats.delayed_us, 50_000);
        assert!(b.describe().ends_with(
            ", injecting delay:read:20ms,delay:any@0-4K:10ms,read@0-4K:EIO:once,any:EPERM:once"
        ));
    });
}

/// In a coroutine the delay is a timeout on the ring: other coroutines run meanwhile.
#[test]
fn a_delay_does_not_block_the_loop() {
    let rt = runtime::Runtime::new(runtime::Config::default()).unwrap();
    let done = rt
        .block_on(|co| {
            let b = Arc::new(null("delay:read@0-4K:100ms"));
            let slow = Arc::clone(&b);
            let started = Instant::now();
            let handle = co
                .spawn_joinable(move |co| {
                    let mut buf = vec![0u8; 4096];
                    let cx = Ctx::Coroutine(co);
                    slow.readv(&cx, &mut [io::IoSliceMut::new(&mut buf)], 0)
                        .unwrap();
                    started.elapsed()
                })
                .unwrap();
            co.yield_now();
            let mut buf = vec![0u8; 4096];
            b.readv(
                &Ctx::Coroutine(co),
                &mut [io::IoSliceMut::new(&mut buf)],
                8192,
            )
            .unwrap();
            let fast = started.elapsed();
            (fast, handle.join(co).unwrap())
        })
        .unwrap();
    let (fast, slow) = done;
    assert!(fast < Duration::from_millis(50), "fast read took {fast:?}");
    assert!(
        slow >= Duration::from_millis(100),
        "slow read took {slow:?}"
    );
}
