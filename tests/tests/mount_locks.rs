//! File locks through `corofuse mount-dir` are the source's: fcntl (classic and OFD) and
//! flock locks taken by processes through the mount conflict with each other and with
//! processes locking the source directly, shared locks share, a blocked lock waits for
//! the holder's exit (a lock goes with its owner's close) without holding back other
//! requests, and a signal ends the wait (INTERRUPT). Each lock is taken by a process of
//! its own (`locker`, tests/src/bin/locker.rs).

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use corofuse_tests::{dispatch_tests, Dispatch, MountedExport};

/// A `locker` process holding (or trying) a lock; killed if still running when dropped.
struct Locker {
    child: Child,
    line: String,
}

impl Locker {
    /// Starts `locker ARGS` and waits for its one line.
    fn start(args: &[&str]) -> Locker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_locker"))
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start locker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Locker {
            child,
            line: line.trim().to_string(),
        }
    }

    fn finish(mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One lock attempt, held `hold_ms`: its line once it has one.
fn lock(kind: &str, kind_of_lock: &str, wait: &str, path: &Path, hold_ms: u32) -> Locker {
    let path = path.to_str().unwrap();
    Locker::start(&[kind, kind_of_lock, wait, path, &hold_ms.to_string()])
}

fn try_lock(kind: &str, kind_of_lock: &str, path: &Path) -> String {
    let attempt = lock(kind, kind_of_lock, "nowait", path, 0);
    let line = attempt.line.clone();
    attempt.finish();
    line
}

/// [`try_lock`] until it takes the lock, for up to 5 s: a holder's exit lets its locks go
/// through the mount when its RELEASE reaches the daemon, which the kernel sends after the
/// close returns (with worker threads, a little later still).
fn lock_when_let_go(kind: &str, path: &Path) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let line = try_lock(kind, "ex", path);
        if line == "locked" || std::time::Instant::now() > deadline {
            return line;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn source() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"locked data").unwrap();
    dir
}

dispatch_tests!(mount_dir_locks_meet_each_other_and_the_source[coroutine, threads, uring]);
fn mount_dir_locks_meet_each_other_and_the_source(mode: Dispatch) {
    let src = source();
    let mnt = tempfile::tempdir().unwrap();
    let export = MountedExport::start_dir(src.path(), mnt.path(), mode, &[]);
    let (through, direct) = (export.path().join("f"), src.path().join("f"));
    for kind in ["posix", "ofd", "flock"] {
        // Held through the mount: another process through the mount and one on the
        // source both find it taken.
        let holder = lock(kind, "ex", "nowait", &through, 60_000);
        assert_eq!(holder.line, "locked", "{mode} {kind}");
        assert_eq!(
            try_lock(kind, "ex", &through),
            "busy",
            "{mode} {kind}: mount"
        );
        assert_eq!(
            try_lock(kind, "sh", &direct),
            "busy",
            "{mode} {kind}: source"
        );
        drop(holder); // killed: its close lets the lock go
        assert_eq!(
            lock_when_let_go(kind, &through),
            "locked",
            "{mode} {kind}: let go"
        );

        // Held on the source: the mount sees it; a blocking lock through the mount waits
        // for the holder's exit. (First the lock taken through the mount just above must
        // be gone from the source: its RELEASE comes after its process's exit.)
        assert_eq!(lock_when_let_go(kind, &direct), "locked", "{mode} {kind}");
        let holder = lock(kind, "ex", "nowait", &direct, 1_000);
        assert_eq!(holder.line, "locked");
        assert_eq!(try_lock(kind, "sh", &through), "busy", "{mode} {kind}");
        let waiter = lock(kind, "ex", "wait", &through, 0);
        assert_eq!(
            waiter.line, "locked",
            "{mode} {kind}: waited for the holder"
        );
        assert!(holder.child.id() > 0);
        holder.finish();
        waiter.finish();

        // Shared locks share, on both sides.
        let reader = lock(kind, "sh", "nowait", &through, 60_000);
        assert_eq!(reader.line, "locked");
        assert_eq!(try_lock(kind, "sh", &direct), "locked", "{mode} {kind}");
        assert_eq!(try_lock(kind, "sh", &through), "locked", "{mode} {kind}");
        assert_eq!(try_lock(kind, "ex", &through), "busy", "{mode} {kind}");
        drop(reader);
    }
    export.stop();
}

dispatch_tests!(mount_dir_a_blocked_lock_holds_back_nothing_and_ends_on_a_signal[coroutine, threads, queues]);
fn mount_dir_a_blocked_lock_holds_back_nothing_and_ends_on_a_signal(mode: Dispatch) {
    let src = source();
    let mnt = tempfile::tempdir().unwrap();
    let export = MountedExport::start_dir(src.path(), mnt.path(), mode, &[]);
    let through = export.path().join("f");
    let holder = lock("posix", "ex", "nowait", &through, 60_000);
    assert_eq!(holder.line, "locked");
    // A waiter that blocks in SETLKW for good, and meanwhile requests on the same daemon
    // (the same loop, with one loop) are served.
    let mut waiter = Command::new(env!("CARGO_BIN_EXE_locker"))
        .args(["posix", "ex", "wait", through.to_str().unwrap(), "0"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(waiter.try_wait().unwrap(), None, "{mode}: waiting");
    assert_eq!(fs::read(&through).unwrap(), b"locked data", "{mode}");
    fs::write(export.path().join("other"), b"x").unwrap();
    assert_eq!(fs::read_dir(export.path()).unwrap().count(), 2, "{mode}");
    let _ = waiter.kill();
    let _ = waiter.wait();
    // A signal ends a blocked wait with EINTR, fcntl and flock alike.
    let path = through.to_str().unwrap();
    let interrupted = Locker::start(&["posix", "ex", "wait", path, "0", "200"]);
    assert_eq!(interrupted.line, "interrupted", "{mode}");
    interrupted.finish();
    assert_eq!(
        try_lock("flock", "ex", &through),
        "locked",
        "flock and fcntl locks are apart"
    );
    let flock_holder = lock("flock", "ex", "nowait", &through, 60_000);
    assert_eq!(flock_holder.line, "locked");
    let interrupted = Locker::start(&["flock", "ex", "wait", path, "0", "200"]);
    assert_eq!(interrupted.line, "interrupted", "{mode}: flock");
    interrupted.finish();
    drop(flock_holder);
    drop(holder);
    assert_eq!(
        lock_when_let_go("posix", &through),
        "locked",
        "{mode}: let go at exit"
    );
    export.stop();
}
