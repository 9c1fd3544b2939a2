//! I/O through the ring: agreement with std::fs, many waiters at once, sleeping.

use std::fs::{self, OpenOptions};
use std::io::{IoSlice, IoSliceMut, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::time::{Duration, Instant};

use runtime::{Config, Runtime};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn reads_and_writes_agree_with_std_fs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("image");
    let mut expected = vec![0u8; 64 * 1024];
    let mut std_file = fs::File::create(&path).unwrap();
    std_file.write_all(&expected).unwrap();
    let file = Rc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(),
    );

    let (f, exp) = (file.clone(), pattern(8192, 1));
    rt().block_on(move |co| {
        // Plain write, then vectored write of three pieces straddling it.
        assert_eq!(co.ctx().write_at(&*f, &exp, 4096).unwrap(), 8192);
        let (a, b, c) = (pattern(100, 2), pattern(4000, 3), pattern(3, 4));
        let iov = [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)];
        assert_eq!(co.ctx().writev_at(&*f, &iov, 10_000).unwrap(), 4103);
        co.ctx().fdatasync(&*f).unwrap();
        co.ctx().fsync(&*f).unwrap();
    })
    .unwrap();
    expected[4096..12288].copy_from_slice(&pattern(8192, 1));
    expected[10_000..10_100].copy_from_slice(&pattern(100, 2));
    expected[10_100..14_100].copy_from_slice(&pattern(4000, 3));
    expected[14_100..14_103].copy_from_slice(&pattern(3, 4));
    assert_eq!(fs::read(&path).unwrap(), expected);

    // std writes, ring reads (plain and vectored).
    std_file.write_all_at(&pattern(5000, 9), 30_000).unwrap();
    expected[30_000..35_000].copy_from_slice(&pattern(5000, 9));
    let (f, exp) = (file.clone(), expected.clone());
    rt().block_on(move |co| {
        let mut whole = vec![0u8; exp.len()];
        assert_eq!(co.ctx().read_at(&*f, &mut whole, 0).unwrap(), exp.len());
        assert_eq!(whole, exp);
        let (mut x, mut y) = (vec![0u8; 1234], vec![0u8; 4321]);
        let mut iov = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        assert_eq!(co.ctx().readv_at(&*f, &mut iov, 29_000).unwrap(), 5555);
        assert_eq!(x, exp[29_000..30_234]);
        assert_eq!(y, exp[30_234..34_555]);
        // A read past EOF returns 0 bytes.
        assert_eq!(co.ctx().read_at(&*f, &mut x, 1 << 20).unwrap(), 0);
    })
    .unwrap();
}

#[test]
fn fallocate_grows_and_punches() {
    let file = Rc::new(tempfile::tempfile().unwrap());
    let f = file.clone();
    rt().block_on(move |co| {
        co.ctx().fallocate(&*f, 0, 0, 1 << 20).unwrap();
        co.ctx().write_at(&*f, &[7u8; 4096], 0).unwrap();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        co.ctx().fallocate(&*f, punch, 0, 4096).unwrap();
    })
    .unwrap();
    assert_eq!(file.metadata().unwrap().len(), 1 << 20);
    let mut back = [1u8; 4096];
    file.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, [0u8; 4096]);
}

#[test]
fn errors_carry_the_kernel_errno() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro");
    fs::write(&path, b"data").unwrap();
    let read_only = Rc::new(fs::File::open(&path).unwrap());
    let err = rt()
        .block_on(move |co| co.ctx().write_at(&*read_only, b"x", 0).unwrap_err())
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::EBADF));
}

#[test]
fn pipe_reads_and_poll_wake_the_right_coroutine() {
    let (mut reader, mut writer) = std::io::pipe().unwrap();
    let rt = rt();
    let reader_fd = Rc::new(reader.try_clone().unwrap());
    let got = rt.spawn_joinable(move |co| {
        let revents = co.ctx().poll(&*reader_fd, libc::POLLIN).unwrap();
        assert!(revents & libc::POLLIN != 0);
        let mut buf = [0u8; 5];
        let n = co.ctx().read(&*reader_fd, &mut buf).unwrap();
        buf[..n].to_vec()
    });
    let got = got.unwrap();
    rt.spawn(move |co| {
        co.ctx().sleep(Duration::from_millis(5)).unwrap();
        writer.write_all(b"hello").unwrap();
    })
    .unwrap();
    rt.run().unwrap();
    assert_eq!(got.try_take().unwrap().unwrap(), b"hello");
    let mut rest = Vec::new();
    drop(rt);
    reader.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn ten_thousand_live_coroutines_each_waiting_on_io_uring() {
    const N: u64 = 10_000;
    let rt = rt();
    let done = Rc::new(std::cell::Cell::new(0u64));
    for _ in 0..N {
        let done = done.clone();
        rt.spawn(move |co| {
            co.ctx().sleep(Duration::from_millis(50)).unwrap();
            done.set(done.get() + 1);
        })
        .unwrap();
    }
    let start = Instant::now();
    rt.run().unwrap();
    assert_eq!(done.get(), N);
    let c = rt.counters();
    assert_eq!(c.peak_live, N, "all were alive at once");
    assert_eq!(c.sqes_submitted, N);
    assert_eq!(c.cqes_reaped, N);
    assert_eq!((c.completed, c.live), (N, 0));
    // They slept concurrently, not one after another (10,000 x 50 ms would be 500 s).
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn seek_position_reads_work_on_regular_files_too() {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(b"abcdef").unwrap();
    file.seek(SeekFrom::Start(2)).unwrap();
    let file = Rc::new(file);
    let f = file.clone();
    let got = rt()
        .block_on(move |co| {
            let mut buf = [0u8; 2];
            co.ctx().read(&*f, &mut buf).unwrap();
            buf
        })
        .unwrap();
    assert_eq!(&got, b"cd");
}

#[test]
fn cancel_io_wakes_a_coroutine_blocked_on_a_pipe_with_ecanceled() {
    let (reader, _writer) = std::io::pipe().unwrap();
    let rt = rt();
    let reader = Rc::new(reader);
    let r = reader.clone();
    let blocked = rt
        .spawn_joinable(move |co| {
            let mut buf = [0u8; 8];
            co.ctx().read(&*r, &mut buf).unwrap_err().raw_os_error()
        })
        .unwrap();
    let id = blocked.id();
    let outcome = rt
        .block_on(move |co| {
            co.ctx().nop().unwrap(); // the reader's SQE went out in the same batch
            let cancelled = co.cancel_io(id).unwrap();
            let again = co.cancel_io(runtime::TaskId(u64::MAX)).unwrap();
            (cancelled, again, blocked.join(co).unwrap())
        })
        .unwrap();
    assert_eq!(outcome, (true, false, Some(libc::ECANCELED)));
}

#[test]
fn polling_before_sleeping_catches_quick_completions() {
    let rt = Runtime::new(Config {
        poll_ns: 5_000_000,
        ..Config::default()
    })
    .unwrap();
    rt.block_on(|co| {
        for _ in 0..100 {
            co.ctx().nop().unwrap();
        }
    })
    .unwrap();
    let c = rt.counters();
    assert_eq!(c.poll_hits + c.poll_misses, 100, "one idle wait per NOP");
    assert!(
        c.poll_hits >= 90,
        "a NOP completes within the 5 ms window: {c:?}"
    );
    let sleeper = Runtime::new(Config::default()).unwrap();
    sleeper.block_on(|co| co.ctx().nop().unwrap()).unwrap();
    assert_eq!(
        sleeper.counters().poll_hits + sleeper.counters().poll_misses,
        0
    );
}
