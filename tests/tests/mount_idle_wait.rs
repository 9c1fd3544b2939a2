//! `--idle-wait block` (the default): a /dev/fuse loop with nothing else to do, whose
//! requests are slow to serve, waits for a request in a blocking read and serves it with
//! blocking calls; a deep client's pile of requests makes it wait through its ring and
//! serve in coroutines for a while. Every other behaviour of the mode (data, stops,
//! unmounts) runs in the `coroutine` and `queues` modes of `dispatch_tests!` (and of
//! `ring` in its `ring` mode); these check which way requests were served, and that a
//! snapshot (SIGUSR1) and a stop (SIGTERM) end a blocked read.

use std::os::unix::fs::FileExt;

use corofuse_tests::export::read_stats;
use corofuse_tests::{
    assert_bytes_eq, open_direct, pattern, require_fuse, AlignedBuf, Dispatch, MountedExport,
    Sandbox, MIB,
};

const LEN: u64 = 4 * MIB;

/// Each read of the backend takes 1 ms: a request served with blocking calls holds the
/// loop long enough for a deep client's next requests to queue behind it.
const SLOW_READS: [&str; 2] = ["--inject", "delay:read:1ms"];

fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats["queue"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no queue.{name} counter in {stats}"))
}

/// One client at a time through the export: `clients` threads, each reading `reads` 4 KiB
/// blocks with O_DIRECT, one at a time, and checking them.
fn read_with(export: &MountedExport, clients: u64, reads: u64) {
    std::thread::scope(|scope| {
        for t in 0..clients {
            scope.spawn(move || {
                let file = open_direct(export.path(), false).unwrap();
                for i in 0..reads {
                    let offset = ((i * clients + t) * 4096) % LEN;
                    let mut back = AlignedBuf::zeroed(4096);
                    file.read_exact_at(&mut back, offset).unwrap();
                    assert_bytes_eq(&back, &pattern(3, offset, 4096), &format!("at {offset}"));
                }
            });
        }
    });
}

/// How many CPUs each event loop thread of process `pid` may run on now
/// (`Cpus_allowed_list` of its `fuse-loop-N` tasks).
fn loop_cpus(pid: u32) -> Vec<usize> {
    let mut counts = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuse-loop") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_default();
        let cpus = list
            .trim()
            .split(',')
            .map(|range| match range.split_once('-') {
                Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
                None => 1,
            });
        counts.push(cpus.sum());
    }
    counts
}

/// Mounts the image with slow reads, runs each phase `(clients, reads)` of [`read_with`]
/// in turn; then, the loops idle (blocked in their reads if they block), a snapshot and a
/// stop. Returns the daemon's counters at the snapshot, and how many CPUs each loop
/// thread could run on while idle.
fn serve(phases: &[(u64, u64)]) -> (serde_json::Value, Vec<usize>) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(3, 0, LEN as usize));
    serve_image(&sandbox, &image, phases)
}

/// [`serve`] of the image at `image`.
fn serve_image(
    sandbox: &Sandbox,
    image: &std::path::Path,
    phases: &[(u64, u64)],
) -> (serde_json::Value, Vec<usize>) {
    let stats = sandbox.path("stats.json");
    let mut args = vec!["--stats", stats.to_str().unwrap()];
    args.extend(SLOW_READS);
    let mnt = sandbox.mountpoint("mnt");
    let mut export = MountedExport::start(image, &mnt, Dispatch::QUEUES, &args);
    for &(clients, reads) in phases {
        read_with(&export, clients, reads);
    }
    std::thread::sleep(std::time::Duration::from_millis(50)); // the loops back to waiting
    let cpus = loop_cpus(export.pid());
    // Every loop is idle now: a snapshot must reach each one, blocked or not (it answers
    // within read_stats' timeout), and the stop too (`stop` waits for the exit).
    export.signal(libc::SIGUSR1);
    let snapshot = read_stats(&stats);
    export.stop();
    (snapshot, cpus)
}

#[test]
fn mount_idle_wait_block_serves_one_client_at_a_time_with_blocking_calls() {
    require_fuse!();
    let (stats, cpus) = serve(&[(1, 200)]);
    let requests = counter(&stats, "requests");
    let blocked = counter(&stats, "blocked_reads");
    let served = counter(&stats, "served_blocking");
    // The 200 READs come one at a time, each slow (1 ms): once the first ones have shown
    // the loops that, each is waited for in a blocking read and served with blocking
    // calls (a few may go the other way: those taken while a loop was woken for a
    // placement trial).
    assert!(
        served >= 150,
        "{served} of {requests} served blocking: {stats}"
    );
    assert!(
        blocked >= 150,
        "{blocked} blocked reads of {requests}: {stats}"
    );
    // One request at a time is never a pile.
    assert_eq!(counter(&stats, "deep_holds"), 0, "{stats}");
    // Blocked, a loop floats on the process's CPUs (pinned to one while it serves on its
    // ring); a loop the placement has paused meanwhile stays pinned.
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    if allowed > 1 {
        assert_eq!(cpus.len(), 2, "two loop threads: {cpus:?}");
        assert!(cpus.iter().any(|&n| n > 1), "CPUs of each loop: {cpus:?}");
    } else {
        println!("one CPU: the loops cannot float, not checked");
    }
}

#[test]
fn mount_idle_wait_block_leaves_a_deep_pile_to_coroutines() {
    require_fuse!();
    // One client first, so that the loops block; then 16 at once, whose requests pile
    // up behind the first one served with blocking calls.
    let (stats, _) = serve(&[(1, 20), (16, 40)]);
    let requests = counter(&stats, "requests");
    let served = counter(&stats, "served_blocking");
    assert!(
        counter(&stats, "deep_holds") > 0,
        "16 clients never piled up: {stats}"
    );
    assert!(
        served * 2 < requests,
        "{served} of {requests} requests served blocking: {stats}"
    );
}

#[test]
fn mount_idle_wait_block_never_serves_an_image_on_fuse_with_blocking_calls() {
    require_fuse!();
    // The image is on a FUSE mount (a directory export of the sandbox): a read of it may
    // stall for as long as that server likes, so no request may hold a loop: each is
    // served in a coroutine (the loops may still wait for one in a blocking read).
    let sandbox = Sandbox::new();
    let source = sandbox.path("source");
    std::fs::create_dir(&source).unwrap();
    std::fs::write(source.join("disk.img"), pattern(3, 0, LEN as usize)).unwrap();
    let on_fuse = sandbox.path("on-fuse");
    std::fs::create_dir(&on_fuse).unwrap();
    let dir_export = MountedExport::start_dir(&source, &on_fuse, Dispatch::Coroutine, &[]);
    let (stats, _) = serve_image(&sandbox, &dir_export.path().join("disk.img"), &[(1, 200)]);
    let dispatch = stats["dispatch"].as_str().unwrap_or_default();
    assert!(!dispatch.contains("ring"), "the default, block: {dispatch}");
    assert!(counter(&stats, "requests") >= 200, "{stats}");
    assert_eq!(counter(&stats, "served_blocking"), 0, "{stats}");
    dir_export.stop();
}
