//! `--idle-wait block`: a /dev/fuse loop with nothing else to do waits for a request in a
//! blocking read and serves it with blocking calls; a deep client's pile of requests makes
//! it wait through its ring and serve in coroutines for a while. Every other behaviour of
//! the mode (data, stops, unmounts, snapshots) runs in the `blocking` mode of
//! `dispatch_tests!`; these check which way requests were served.

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

/// `clients` threads, each reading `reads` 4 KiB blocks with O_DIRECT, one at a time, and
/// checking them; returns the daemon's counters at exit.
fn serve(clients: u64, reads: u64) -> serde_json::Value {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(3, 0, LEN as usize));
    let stats = sandbox.path("stats.json");
    let mut args = vec!["--stats", stats.to_str().unwrap()];
    args.extend(SLOW_READS);
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        Dispatch::Blocking,
        &args,
    );
    std::thread::scope(|scope| {
        for t in 0..clients {
            let export = &export;
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
    export.stop();
    read_stats(&stats)
}

#[test]
fn mount_idle_wait_block_serves_one_client_at_a_time_with_blocking_calls() {
    require_fuse!();
    let stats = serve(1, 200);
    let (requests, blocked) = (
        counter(&stats, "requests"),
        counter(&stats, "blocked_reads"),
    );
    let served = counter(&stats, "served_blocking");
    // Every READ waited for by an idle loop; the rest (OPEN, FLUSH, RELEASE, the reads
    // taken during a placement trial's wake-up) may go either way.
    assert!(
        blocked >= 100,
        "{blocked} blocked reads of {requests}: {stats}"
    );
    assert!(
        served >= blocked,
        "{served} served blocking, {blocked} blocked reads: {stats}"
    );
    // One request at a time is never a pile.
    assert_eq!(counter(&stats, "deep_holds"), 0, "{stats}");
}

#[test]
fn mount_idle_wait_block_leaves_a_deep_pile_to_coroutines() {
    require_fuse!();
    let stats = serve(16, 40);
    let requests = counter(&stats, "requests");
    let served = counter(&stats, "served_blocking");
    assert!(
        counter(&stats, "deep_holds") > 0,
        "16 clients never piled up: {stats}"
    );
    assert!(
        served * 2 < requests,
        "{served} of {requests} requests served blocking under 16 clients: {stats}"
    );
}
