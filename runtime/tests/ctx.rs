//! `Ctx`, the one public I/O API: the same calls in both modes (a coroutine's ring, blocking
//! syscalls), with the same results; what only a ring can do fails cleanly without one.

use std::io::{self, IoSlice};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use runtime::{opcode, squeue, Config, Ctx, NoRing, Runtime};

fn rt() -> Runtime {
    Runtime::new(Config::default()).expect("io_uring available")
}

/// Runs `f` once as `Ctx::Blocking` and once in a coroutine, and returns both results.
fn in_both_modes<T: 'static>(f: impl Fn(Ctx<'_>) -> T + Clone + 'static) -> [T; 2] {
    let blocking = f(Ctx::Blocking);
    let ring = rt().block_on(move |co| f(co.ctx())).unwrap();
    [blocking, ring]
}

/// What a blocking ring-only call returned: the `NoRing` inside an `Unsupported` error.
fn no_ring(err: io::Error) -> NoRing {
    assert_eq!(err.kind(), io::ErrorKind::Unsupported, "{err}");
    *err.get_ref().unwrap().downcast_ref::<NoRing>().unwrap()
}

#[test]
fn positioned_reads_and_writes_agree_in_both_modes() {
    let got = in_both_modes(|cx| {
        let file = tempfile::tempfile().unwrap();
        assert_eq!(cx.write_at(&file, b"hello, ctx", 4096).unwrap(), 10);
        let mut buf = [0u8; 10];
        assert_eq!(cx.read_at(&file, &mut buf, 4096).unwrap(), 10);
        assert_eq!(
            cx.read_at(&file, &mut buf, 1 << 20).unwrap(),
            0,
            "end of file"
        );
        let huge = cx.read_at(&file, &mut buf, u64::MAX).unwrap_err();
        assert_eq!(
            huge.raw_os_error(),
            Some(libc::EINVAL),
            "not the file position"
        );
        buf
    });
    assert_eq!(got, [*b"hello, ctx"; 2]);
}

#[test]
fn stream_calls_agree_in_both_modes() {
    let got = in_both_modes(|cx| {
        let (a, b) = UnixStream::pair().unwrap();
        let parts = [IoSlice::new(b"one "), IoSlice::new(b"two")];
        assert_eq!(cx.writev(&a, &parts).unwrap(), 7);
        let revents = cx.poll(&b, libc::POLLIN).unwrap();
        assert!(revents & libc::POLLIN != 0);
        let mut head = [0u8; 4];
        assert_eq!(cx.recv(&b, &mut head, libc::MSG_WAITALL).unwrap(), 4);
        let mut tail = [0u8; 8];
        let n = cx.read(&b, &mut tail).unwrap();
        drop(a);
        assert_eq!(cx.read(&b, &mut tail).unwrap(), 0, "end of stream");
        [&head[..], &tail[..n]].concat()
    });
    assert_eq!(got, [b"one two".to_vec(), b"one two".to_vec()]);
}

/// `EAGAIN` is an answer, not retried: here from `recv` with `MSG_DONTWAIT`, the flags
/// reaching the kernel in both modes.
#[test]
fn stream_calls_pass_eagain_through_in_both_modes() {
    let got = in_both_modes(|cx| {
        let (_a, b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 4];
        let recv = cx.recv(&b, &mut buf, libc::MSG_DONTWAIT);
        recv.unwrap_err().raw_os_error()
    });
    assert_eq!(got, [Some(libc::EAGAIN); 2]);
}

#[test]
fn sleep_waits_in_both_modes() {
    let slept = in_both_modes(|cx| {
        let started = std::time::Instant::now();
        cx.sleep(Duration::from_millis(5)).unwrap();
        started.elapsed()
    });
    assert!(
        slept.iter().all(|&d| d >= Duration::from_millis(5)),
        "{slept:?}"
    );
}

#[test]
fn ring_only_calls_fail_without_a_ring_and_work_with_one() {
    let nop = || opcode::Nop::new().build();
    let nop128 = || squeue::Entry128::from(opcode::Nop::new().build());
    let cx = Ctx::Blocking;
    assert_eq!(no_ring(cx.nop().unwrap_err()).op(), "nop");
    // SAFETY: a NOP points to no memory and yields one CQE (here: none, nothing is submitted).
    let err = unsafe { cx.submit(nop()) }.unwrap_err();
    assert_eq!(no_ring(err).op(), "submit");
    // SAFETY: as above.
    let err = unsafe { cx.submit128(nop128()) }.unwrap_err();
    assert_eq!(no_ring(err).op(), "submit128");
    assert!(err_text(cx.nop()).contains("co.ctx()"), "says what to do");

    let rt = Runtime::new(Config {
        sqe128: true,
        ..Config::default()
    })
    .unwrap();
    let res = rt.block_on(move |co| {
        co.ctx().nop().unwrap();
        // SAFETY: a NOP points to no memory and yields one CQE.
        let small = unsafe { co.ctx().submit(nop()) }.unwrap();
        // SAFETY: as above.
        let big = unsafe { co.ctx().submit128(nop128()) }.unwrap();
        (small, big)
    });
    assert_eq!(res.unwrap(), (0, 0));
    assert_eq!(rt.counters().sqes_submitted, 3);
}

fn err_text(res: io::Result<()>) -> String {
    res.unwrap_err().to_string()
}

#[test]
fn ctx_debug_names_the_mode() {
    assert_eq!(format!("{:?}", Ctx::Blocking), "Ctx::Blocking");
    let shown = rt().block_on(|co| format!("{:?}", co.ctx())).unwrap();
    assert!(shown.starts_with("Ctx::Coroutine("), "{shown}");
}
