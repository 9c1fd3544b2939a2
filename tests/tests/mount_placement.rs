//! The loop placement (`--placement adaptive`, the default with several /dev/fuse loops;
//! transport/src/placement.rs): under load its trials pause a loop and take it back, and
//! through all of it every request is served, right; a stop or an unmount that comes in
//! any phase of a trial (a loop paused or not) ends the daemon cleanly.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use corofuse_tests::export::{read_stats, TIMEOUT};
use corofuse_tests::{
    assert_bytes_eq, open_direct, pattern, require_fuse, sys, AlignedBuf, Dispatch, MountedExport,
    Sandbox, MIB,
};

const LEN: u64 = 8 * MIB;
/// Two loops (pinned to the first two CPUs, cycling on a one-CPU machine).
const MODE: Dispatch = Dispatch::Queues(2);

/// The trials' pauses, summed over the loops of a `--stats` file.
fn pauses(stats: &Path) -> u64 {
    let json = read_stats(stats);
    json["per_queue"]
        .as_array()
        .expect("per_queue")
        .iter()
        .map(|q| q["pauses"].as_u64().unwrap_or(0))
        .sum()
}

/// Four clients, each writing its own 4 KiB slots and reading them back, until `stop`,
/// counting the transfers in `done`. Panics on a wrong byte, and on a failed call unless
/// `may_fail` (the mount goes away under them), which then ends that client.
fn clients(path: &Path, stop: &AtomicBool, done: &AtomicU64, may_fail: bool) {
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            scope.spawn(move || {
                let file = open_direct(path, true).unwrap();
                let mut back = AlignedBuf::zeroed(4096);
                for i in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let offset = ((i * 4 + t) * 4096) % LEN;
                    let data = AlignedBuf::from_slice(&pattern(t + 100 * i, offset, 4096));
                    let io = file
                        .write_all_at(&data, offset)
                        .and_then(|()| file.read_exact_at(&mut back, offset));
                    match io {
                        Err(_) if may_fail => break,
                        Err(e) => panic!("client {t} at {offset}: {e}"),
                        Ok(()) => {}
                    }
                    assert_bytes_eq(&back, &data, &format!("client {t} at {offset}"));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
}

#[test]
fn mount_placement_trials_pause_loops_and_every_request_is_served() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, LEN as usize));
    let stats = sandbox.path("stats.json");
    let args = ["-w", "--stats", stats.to_str().unwrap()];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), MODE, &args);
    let (stop, done) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| clients(export.path(), &stop, &done, false));
        // The first trial starts 0.4 s after the mount and takes 0.19 s; the second
        // follows 0.4 or 0.8 s later.
        std::thread::sleep(Duration::from_millis(2000));
        stop.store(true, Ordering::Relaxed);
    });
    export.stop();
    let n = pauses(&stats);
    assert!(n >= 1, "no trial paused a loop in 2 s of load");
    assert!(done.load(Ordering::Relaxed) > 1000, "too little I/O");
    // The controller's own account (issue 37): its trials, and the time with 0, 1 and 2
    // loops paused, which covers the session.
    let placement = &read_stats(&stats)["placement"];
    assert!(placement["trials"].as_u64() >= Some(1), "{placement}");
    let states = placement["ms_with_paused"]
        .as_array()
        .expect("ms_with_paused");
    let ms: Vec<u64> = states.iter().filter_map(|v| v.as_u64()).collect();
    assert_eq!(ms.len(), 3, "{placement}");
    assert!(
        ms[1] > 0 && ms[2] == 0,
        "a trial paused one loop, never both: {placement}"
    );
    assert!(ms.iter().sum::<u64>() >= 1500, "{placement}");
}

#[test]
fn mount_placement_stop_or_unmount_in_any_phase_of_a_trial_ends_cleanly() {
    require_fuse!();
    let mut paused_at_the_end = 0;
    // A trial: measure 400-450 ms, settle (a loop paused) to 470, measure to 520, settle
    // (taken back) to 540, measure to 590; then maybe paused for good.
    for (round, at_ms) in [430u64, 460, 500, 530, 580, 700, 460, 500]
        .into_iter()
        .enumerate()
    {
        let unmount = round % 2 == 1;
        let sandbox = Sandbox::new();
        let image = sandbox.file("disk.img", &pattern(2, 0, LEN as usize));
        let stats = sandbox.path("stats.json");
        let args = ["-w", "--stats", stats.to_str().unwrap()];
        let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), MODE, &args);
        let (stop, done) = (AtomicBool::new(false), AtomicU64::new(0));
        let path = export.path().to_path_buf();
        let started = Instant::now();
        std::thread::scope(|scope| {
            let load = scope.spawn(|| clients(&path, &stop, &done, true));
            std::thread::sleep(Duration::from_millis(at_ms).saturating_sub(started.elapsed()));
            if unmount {
                // Detached lazily while the clients hold the file open: the connection
                // ends when they close it, which they do now.
                sys::umount_lazy(export.path()).unwrap();
                stop.store(true, Ordering::Relaxed);
            } else {
                export.signal(libc::SIGTERM);
            }
            let status = export.wait_exit(TIMEOUT).unwrap_or_else(|| {
                panic!(
                    "round {round} ({at_ms} ms, {}): no exit; {}",
                    if unmount { "unmount" } else { "SIGTERM" },
                    export.diagnose()
                )
            });
            assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
            stop.store(true, Ordering::Relaxed);
            load.join().unwrap();
        });
        export.assert_unmounted();
        assert!(done.load(Ordering::Relaxed) > 0, "round {round}: no I/O");
        paused_at_the_end += u64::from(pauses(&stats) > 0);
    }
    assert!(
        paused_at_the_end >= 1,
        "no round ended after a trial had paused a loop: the phases were not reached"
    );
}
