//! The daemon's life, in every `--dispatch` mode: SIGTERM/SIGINT/SIGHUP with I/O in flight
//! end it cleanly (status 0, mount gone, the file underneath back as it was), so does an
//! unmount from outside, and SIGUSR1 / exit write `--stats`; the pidfile is removed at
//! exit, and unwritable `--pidfile`/`--stats` paths are refused before anything mounts.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use corofuse_tests::export::{read_stats, wait_for_progress, TIMEOUT};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, pattern, sys, AlignedBuf, Dispatch,
    MountedExport, Sandbox, KIB, MIB,
};

const LEN: u64 = 16 * MIB;
const CHUNK: u64 = 64 * KIB;
const CHUNKS: u64 = LEN / CHUNK;

/// Writes chunk after chunk (pass `i / CHUNKS` of chunk `i % CHUNKS`), reading each back,
/// until an operation fails; counts the writes completed and returns the errno.
fn churn(mount: &Path, writes_done: &AtomicU64) -> i32 {
    let file = open_direct(mount, true).expect("open the mount");
    let mut back = AlignedBuf::zeroed(CHUNK as usize);
    for i in 0.. {
        let offset = i % CHUNKS * CHUNK;
        let data = AlignedBuf::from_slice(&pattern(i / CHUNKS, offset, CHUNK as usize));
        if let Err(e) = file.write_all_at(&data, offset) {
            return e.raw_os_error().unwrap_or(0);
        }
        writes_done.store(i + 1, SeqCst);
        if let Err(e) = file.read_exact_at(&mut back, offset) {
            return e.raw_os_error().unwrap_or(0);
        }
        assert_bytes_eq(&back, &data, "read after write");
    }
    unreachable!()
}

fn stop_with_io_in_flight(mode: Dispatch, signal: i32) {
    let sandbox = Sandbox::new();
    let underneath = pattern(99, 0, 10_000);
    let mountpoint = sandbox.file("mnt", &underneath);
    let image = sandbox.sparse("disk.img", LEN);
    let mut export = MountedExport::start(&image, &mountpoint, mode, &["-w"]);
    let writes = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let (mount, counter) = (export.path().to_owned(), Arc::clone(&writes));
    // Not scoped: if the I/O hangs, the test fails instead of hanging with it.
    std::thread::spawn(move || tx.send(churn(&mount, &counter)));
    wait_for_progress(&writes, 20, "no I/O progress through the mount");
    export.signal(signal);
    let status = export.wait_exit(TIMEOUT).expect("the daemon must exit");
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
    let errno = rx
        .recv_timeout(TIMEOUT)
        .expect("the I/O thread must not hang");
    // With FUSE over io_uring the kernel answers a request still queued for a ring entry
    // when the ring closes with ECANCELED.
    let ring = (mode == Dispatch::Uring).then_some(libc::ECANCELED);
    assert!(
        [libc::ENOTCONN, libc::EIO, libc::ENODEV, libc::ECONNABORTED].contains(&errno)
            || ring == Some(errno),
        "the I/O thread ended with errno {errno}"
    );
    assert_bytes_eq(
        &fs::read(&mountpoint).unwrap(),
        &underneath,
        "file underneath",
    );
    // Every write that completed before the stop is in the image (the one in flight may
    // or may not be).
    let done = writes.load(SeqCst);
    let on_disk = fs::read(&image).unwrap();
    let in_flight = done % CHUNKS;
    for chunk in (0..CHUNKS.min(done)).filter(|&c| c != in_flight) {
        let last = (done - 1 - chunk) / CHUNKS * CHUNKS + chunk;
        let offset = chunk * CHUNK;
        let bytes = &on_disk[offset as usize..][..CHUNK as usize];
        let want = pattern(last / CHUNKS, offset, CHUNK as usize);
        assert_bytes_eq(bytes, &want, &format!("chunk {chunk} after {done} writes"));
    }
}

dispatch_tests!(mount_sigterm_with_io_in_flight_exits_cleanly + ring);
fn mount_sigterm_with_io_in_flight_exits_cleanly(mode: Dispatch) {
    stop_with_io_in_flight(mode, libc::SIGTERM);
}

dispatch_tests!(mount_sigint_with_io_in_flight_exits_cleanly);
fn mount_sigint_with_io_in_flight_exits_cleanly(mode: Dispatch) {
    stop_with_io_in_flight(mode, libc::SIGINT);
}

dispatch_tests!(mount_sighup_with_io_in_flight_exits_cleanly);
/// SIGHUP (a closed terminal, a session's end) ends the daemon as SIGTERM does, as it ends
/// qemu-storage-daemon: its default would kill it with the mount left stale.
fn mount_sighup_with_io_in_flight_exits_cleanly(mode: Dispatch) {
    stop_with_io_in_flight(mode, libc::SIGHUP);
}

dispatch_tests!(mount_pidfile_is_removed_at_exit[coroutine, threads]);
/// The pidfile names the daemon while it serves and is gone once it has exited, after
/// SIGTERM and after an unmount from outside alike.
fn mount_pidfile_is_removed_at_exit(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let pidfile = sandbox.path("d.pid");
    for outside in [false, true] {
        let mnt = sandbox.file("mnt", b"");
        let pid_arg = ["--pidfile", pidfile.to_str().unwrap()];
        let mut export = MountedExport::start("null:1M", &mnt, mode, &pid_arg);
        let pid = export.pid();
        assert_eq!(fs::read_to_string(&pidfile).unwrap(), format!("{pid}\n"));
        match outside {
            false => export.stop(),
            true => {
                let out = corofuse_tests::export::umount(export.path());
                assert!(out.status.success(), "{}", out.stderr);
                let status = export.wait_exit(TIMEOUT).expect("exits after the unmount");
                assert!(status.success(), "{status}: {}", export.stderr());
                export.released();
            }
        }
        assert!(
            !pidfile.exists(),
            "{mode}: pidfile left (unmount from outside: {outside})"
        );
    }
}

#[test]
/// `--stats` or `--pidfile` where no file can be made is one line at start, naming the
/// option and the path, before the image is opened or anything is mounted.
fn mount_unwritable_stats_or_pidfile_is_refused_at_start() {
    let sandbox = Sandbox::new();
    let mnt = sandbox.file("mnt", b"");
    let missing = sandbox.path("no/such/dir/out");
    let dir = sandbox.path("");
    for path in [&missing, &dir] {
        let args = ["--stats", path.to_str().unwrap()];
        let image = "null:1M".as_ref();
        corofuse_tests::export::assert_setup_error(&sandbox, image, &mnt, &args, &args);
    }
    // (assert_setup_error passes a --pidfile of its own.)
    let argv: [&std::ffi::OsStr; 5] = [
        "mount".as_ref(),
        "null:1M".as_ref(),
        mnt.as_os_str(),
        "--pidfile".as_ref(),
        missing.as_os_str(),
    ];
    let failed = corofuse_tests::export::run_to_exit(&argv, &mnt);
    assert!(!failed.status.success());
    let want = format!("cannot write --pidfile {}: No such file", missing.display());
    assert!(failed.stderr.contains(&want), "{}", failed.stderr);
    assert_eq!(failed.stderr.lines().count(), 1, "{}", failed.stderr);
    assert!(!corofuse_tests::mountinfo::is_corofuse_mount(&mnt));
}

dispatch_tests!(mount_sigterm_during_a_burst_with_many_readers[coroutine]);
/// 64 readers (`--readers`, a coroutine-mode option) and four clients: readers often lose
/// the race for a request (EAGAIN) and fall back to polling /dev/fuse. A SIGTERM in the
/// middle of that must still end the daemon once the clients stop. Each round is short;
/// 80 rounds hit the window almost always.
fn mount_sigterm_during_a_burst_with_many_readers(mode: Dispatch) {
    sigterm_during_bursts(mode, &["-w", "--readers", "64"], 80);
}

dispatch_tests!(mount_sigterm_during_a_burst + ring);
/// The same with the default transport: SIGTERM while four clients have requests in
/// flight (in threads mode: while workers are in blocking syscalls or `read(2)` of
/// /dev/fuse) ends the daemon cleanly, round after round.
fn mount_sigterm_during_a_burst(mode: Dispatch) {
    sigterm_during_bursts(mode, &["-w"], 12);
}

/// `rounds` times: mount, a burst of I/O of 20 to 79 ms, SIGTERM; the daemon must exit 0
/// within 10 s and leave no mount.
fn sigterm_during_bursts(mode: Dispatch, args: &[&str], rounds: u64) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, 4 * MIB as usize));
    let mountpoint = sandbox.mountpoint("mnt");
    for round in 0..rounds {
        let mut export = MountedExport::start(&image, &mountpoint, mode, args);
        let burst = Duration::from_millis(20 + round * 7 % 60);
        let files = burst_then_signal(&export, burst, libc::SIGTERM);
        let exited = export.wait_exit(Duration::from_secs(10));
        if exited.is_none() {
            panic!(
                "round {round}: no exit 10 s after SIGTERM; {}",
                export.diagnose()
            );
        }
        assert!(
            exited.unwrap().success(),
            "round {round}: {}",
            export.stderr()
        );
        export.assert_unmounted();
        drop(files);
    }
}

/// Four threads read and write 4 KiB blocks through the mount for `burst`; then, with
/// each thread about to stop, `signal` goes to the daemon. Returns the threads' files,
/// still open (closing them would send the daemon more requests).
fn burst_then_signal(export: &MountedExport, burst: Duration, signal: i32) -> Vec<fs::File> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let clients: Vec<_> = (0..4u64)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let file = open_direct(export.path(), true).ok()?;
                    let mut buf = AlignedBuf::zeroed(4096);
                    for i in (t..).step_by(4).take_while(|_| !stop.load(SeqCst)) {
                        let offset = i % 1024 * 4096;
                        let done = if i % 8 < 4 {
                            file.read_exact_at(&mut buf, offset)
                        } else {
                            file.write_all_at(&buf, offset)
                        };
                        if done.is_err() {
                            break;
                        }
                    }
                    Some(file)
                })
            })
            .collect();
        std::thread::sleep(burst);
        stop.store(true, SeqCst);
        sys::kill(export.pid(), signal).expect("kill(2) our child");
        clients
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect()
    })
}

dispatch_tests!(mount_unmount_from_outside_ends_the_daemon + ring);
fn mount_unmount_from_outside_ends_the_daemon(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    fs::read(export.path()).unwrap();
    sys::umount_lazy(export.path()).expect("umount -l");
    let status = export.wait_exit(TIMEOUT);
    let status = status.expect("the daemon must exit by itself after an unmount");
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
}

/// The stats file, once it is complete JSON (it may be half-written when first seen).
fn counter(stats: &serde_json::Value, section: &str, name: &str) -> u64 {
    stats[section][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {section}.{name} counter in {stats}"))
}

/// Asserts that `stats` says it comes from a daemon in `mode`: its "dispatch" names the
/// mode, and only the modes on the coroutine runtime have runtime counters.
#[track_caller]
fn assert_stats_mode(stats: &serde_json::Value, mode: Dispatch) {
    let dispatch = stats["dispatch"]
        .as_str()
        .unwrap_or_else(|| panic!("no \"dispatch\" string in {stats}"));
    let named = match mode {
        Dispatch::Ring => dispatch.contains("coroutine") && dispatch.contains("--idle-wait ring"),
        _ => dispatch.to_ascii_lowercase().contains(mode.name()),
    } && match mode {
        Dispatch::Threads(n) | Dispatch::Queues(n) => dispatch.contains(&n.to_string()),
        _ => true,
    };
    assert!(named, "\"dispatch\": {dispatch:?} does not name {mode}");
    let spawned = counter(stats, "runtime", "spawned");
    if mode.has_runtime() {
        assert!(spawned > 0, "{mode}: no coroutine spawned: {stats}");
    } else {
        assert_eq!(spawned, 0, "{mode} has no coroutine runtime: {stats}");
    }
}

dispatch_tests!(mount_stats_at_exit + ring);
/// The numbers written at exit: the totals, and they show the mode really ran (a
/// coroutine per request, none per request inline, no runtime with threads).
fn mount_stats_at_exit(mode: Dispatch) {
    const READS: u64 = 10;
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let stats = sandbox.path("stats.json");
    let stats_arg = stats.to_str().unwrap();
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["--stats", stats_arg],
    );
    for _ in 0..READS {
        fs::read(export.path()).unwrap();
    }
    assert!(!stats.exists(), "stats written before SIGUSR1 or exit");
    export.stop();
    let last = read_stats(&stats);
    assert_eq!(last["image"], image.to_str().unwrap(), "{last}");
    assert_stats_mode(&last, mode);
    // Each read is at least OPEN, FLUSH and RELEASE, each answered.
    let requests = counter(&last, "queue", "requests");
    let replies = counter(&last, "queue", "replies");
    assert!(requests >= 3 * READS, "{requests} requests: {last}");
    assert!(replies >= 3 * READS, "{replies} replies: {last}");
    // Per-opcode accounting comes from every transport.
    let opens = last["ops"]["OPEN"]["count"].as_u64().unwrap_or(0);
    assert!(opens >= READS, "{opens} OPENs accounted: {last}");
    let spawned = counter(&last, "runtime", "spawned");
    match mode {
        Dispatch::Coroutine | Dispatch::Queues(_) | Dispatch::Ring => {
            // A request that suspends gets a coroutine of its own (its reader hands reading
            // over to a new one); one that does not (OPEN, FLUSH, RELEASE: no I/O) is served
            // in place by its reader, which then reads the next request.
            // Whether a READ suspends depends on the page cache (a cached read completes at
            // submission and is served in place too): all of them may be in place here;
            // `mount_a_read_that_waits_leaves_its_reader` makes READs wait.
            let in_place = counter(&last, "queue", "served_in_place");
            assert!(in_place > 0, "no request served in place: {last}");
            assert!(in_place <= requests, "more in place than requests: {last}");
            assert!(
                spawned + in_place >= requests,
                "a request neither in place nor on a coroutine: {last}"
            );
        }
        // A ring entry is one coroutine serving request after request.
        Dispatch::Uring => assert!(spawned < requests, "a coroutine per request: {last}"),
        Dispatch::Inline => assert!(spawned < requests, "a coroutine per request: {last}"),
        Dispatch::Threads(_) => {}
    }
}

dispatch_tests!(mount_a_read_that_waits_leaves_its_reader [coroutine, queues]);
/// A request that suspends gets a coroutine of its own, and its reader is not counted as
/// serving it in place: every READ here waits on an injected delay (an io_uring timeout),
/// so none can complete at submission. (`mount_stats_at_exit` cannot check this: a READ
/// the page cache holds completes at submission and is served in place.) With ring waits:
/// a loop that blocks serves the slow READ it waited for with blocking calls, in place.
fn mount_a_read_that_waits_leaves_its_reader(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let stats = sandbox.path("stats.json");
    let args = [
        "--stats",
        stats.to_str().unwrap(),
        "--inject",
        "delay:read:2ms",
        "--idle-wait",
        "ring",
    ];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    assert_eq!(
        fs::read(export.path()).unwrap(),
        pattern(1, 0, MIB as usize)
    );
    export.stop();
    let last = read_stats(&stats);
    // The backend reads that waited, one per READ of data (a READ at the end of the file
    // reads nothing from the backend and waits for nothing).
    let reads = last["ops"]["READ"]["count"].as_u64().unwrap_or(0);
    let waited = last["inject"]["delays_by_op"]["read"].as_u64().unwrap_or(0);
    assert!(
        waited >= 1 && waited <= reads,
        "{reads} READs, {waited} delayed: {last}"
    );
    let requests = counter(&last, "queue", "requests");
    let in_place = counter(&last, "queue", "served_in_place");
    let spawned = counter(&last, "runtime", "spawned");
    assert!(in_place > 0, "OPEN and FLUSH are served in place: {last}");
    assert!(
        in_place + waited <= requests,
        "a READ that waited counted as served in place: {in_place} in place, {waited} \
         waited, of {requests}: {last}"
    );
    assert!(
        spawned >= waited,
        "{spawned} coroutines for {waited} READs that waited: {last}"
    );
}

dispatch_tests!(mount_stats_on_sigusr1_and_at_exit + ring);
/// SIGUSR1 writes the numbers so far without stopping the daemon; those at exit are no
/// smaller. (A snapshot that ends a loop's blocking read: `mount_idle_wait.rs`.)
fn mount_stats_on_sigusr1_and_at_exit(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, MIB as usize));
    let stats = sandbox.path("stats.json");
    let stats_arg = stats.to_str().unwrap();
    let mut export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["--stats", stats_arg],
    );
    fs::read(export.path()).unwrap();
    assert!(!stats.exists(), "stats written before SIGUSR1 or exit");
    export.signal(libc::SIGUSR1);
    let first = read_stats(&stats);
    assert_eq!(first["image"], image.to_str().unwrap(), "{first}");
    assert_stats_mode(&first, mode);
    let requests = counter(&first, "queue", "requests");
    assert!(requests > 0, "no request counted at SIGUSR1: {first}");
    // SIGUSR1 does not stop the export.
    assert!(export.try_status().is_none(), "SIGUSR1 ended the daemon");
    for _ in 0..4 {
        fs::read(export.path()).unwrap();
    }
    export.stop();
    let last = read_stats(&stats);
    assert_stats_mode(&last, mode);
    for (section, name) in [
        ("runtime", "spawned"),
        ("queue", "requests"),
        ("queue", "replies"),
    ] {
        assert!(
            counter(&last, section, name) >= counter(&first, section, name),
            "{section}.{name} went down: {first} then {last}"
        );
    }
    assert!(counter(&last, "queue", "requests") > requests, "{last}");
    if mode == Dispatch::Coroutine {
        // Each request is served either in place by the reader that read it or, once it
        // waits, with a new reader spawned to read on: more requests, more of one or the
        // other. (Which one depends on whether the reads hit the page cache or waited.)
        let served = |stats: &serde_json::Value| {
            counter(stats, "queue", "served_in_place") + counter(stats, "runtime", "spawned")
        };
        assert!(served(&last) > served(&first), "{first} then {last}");
    }
}

dispatch_tests!(mount_serving_requests_allocates_nothing + ring);
/// No heap allocation per request in steady state: the daemon's allocation counter (in
/// `--stats`) barely moves while it serves thousands of requests after a warm-up.
fn mount_serving_requests_allocates_nothing(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(3, 0, 4 * MIB as usize));
    let stats = sandbox.path("stats.json");
    let mut export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--stats", stats.to_str().unwrap()],
    );
    corofuse_tests::export::assert_4k_io_allocates_nothing(&mut export, &stats);
    export.stop();
}
