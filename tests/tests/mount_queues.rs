//! `--queues N` and `--transport`: N event loops, each with its own clone of the /dev/fuse fd, all serving
//! one export. Every export test also runs with `--queues 2` (the `queues` mode of
//! `dispatch_tests!`); these check what only several loops have: that each loop really
//! serves requests, that `--stats` lists them, and that `--cpus` pins them.

use std::fs;
use std::os::unix::fs::FileExt;

use corofuse_tests::{
    assert_bytes_eq, open_direct, pattern, require_fuse, AlignedBuf, Dispatch, MountedExport,
    Sandbox, MIB,
};

const LEN: u64 = 8 * MIB;

/// Four clients at once, each on its own 4 KiB slots, writing then reading back.
fn drive(export: &MountedExport) -> Vec<u8> {
    let mut expected = pattern(1, 0, LEN as usize);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            scope.spawn(move || {
                let file = open_direct(export.path(), true).unwrap();
                for i in 0..500u64 {
                    let offset = ((i * 4 + t) * 4096) % LEN;
                    let data = AlignedBuf::from_slice(&pattern(t + 10, offset, 4096));
                    file.write_all_at(&data, offset).unwrap();
                    let mut back = AlignedBuf::zeroed(4096);
                    file.read_exact_at(&mut back, offset).unwrap();
                    assert_bytes_eq(&back, &data, &format!("client {t} at {offset}"));
                }
            });
        }
    });
    for t in 0..4u64 {
        for i in 0..500u64 {
            let offset = ((i * 4 + t) * 4096) % LEN;
            expected[offset as usize..][..4096].copy_from_slice(&pattern(t + 10, offset, 4096));
        }
    }
    expected
}

#[test]
fn mount_queues_each_loop_serves_and_stats_list_them() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(1, 0, LEN as usize));
    let stats = sandbox.path("stats.json");
    let args = ["-w", "--stats", stats.to_str().unwrap(), "--cpus", "0"];
    let mnt = sandbox.mountpoint("mnt");
    let export = MountedExport::start(&image, &mnt, Dispatch::Queues(2), &args);
    let expected = drive(&export);
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
    let json: serde_json::Value = serde_json::from_slice(&fs::read(&stats).unwrap()).unwrap();
    let per_queue = json["per_queue"].as_array().expect("per_queue in --stats");
    assert_eq!(per_queue.len(), 2, "{json}");
    let requests: Vec<u64> = per_queue
        .iter()
        .map(|q| q["requests"].as_u64().unwrap())
        .collect();
    assert!(
        requests.iter().all(|&n| n > 0),
        "a loop served nothing: {requests:?}"
    );
    let total = json["queue"]["requests"].as_u64().unwrap();
    assert_eq!(
        requests.iter().sum::<u64>(),
        total,
        "merged = sum of the loops"
    );
    assert!(total >= 4000, "{total} requests for 4000 transfers");
}

/// `--transport auto`: FUSE over io_uring where the fuse module offers it (a READ then
/// costs no syscall: it comes and goes with ring commands), else /dev/fuse with a warning.
#[test]
fn mount_transport_auto_uses_the_ring_or_falls_back() {
    require_fuse!();
    let run = |expect_ring: bool| {
        let sandbox = Sandbox::new();
        let image = sandbox.file("disk.img", &pattern(2, 0, MIB as usize));
        let stats = sandbox.path("stats.json");
        let args = ["--transport", "auto", "--stats", stats.to_str().unwrap()];
        let export = MountedExport::start(
            &image,
            &sandbox.mountpoint("mnt"),
            Dispatch::Coroutine,
            &args,
        );
        let file = open_direct(export.path(), false).unwrap();
        let mut buf = AlignedBuf::zeroed(4096);
        for i in 0..50 {
            file.read_exact_at(&mut buf, i * 4096).unwrap();
        }
        drop(file);
        let stderr = export.stderr();
        export.stop();
        let json: serde_json::Value = serde_json::from_slice(&fs::read(&stats).unwrap()).unwrap();
        let syscalls = json["ops"]["READ"]["syscalls_per_request"]
            .as_f64()
            .unwrap();
        let names_uring = json["dispatch"]
            .as_str()
            .is_some_and(|d| d.contains("--transport uring"));
        assert_eq!(
            names_uring, expect_ring,
            "dispatch names the transport chosen: {json}"
        );
        match expect_ring {
            true => assert_eq!(syscalls, 0.0, "READ through the ring: {json}"),
            false => {
                assert!(syscalls >= 1.0, "READ through /dev/fuse: {json}");
                assert!(
                    stderr.contains("serving through /dev/fuse"),
                    "no warning: {stderr}"
                );
            }
        }
    };
    match corofuse_tests::uring::with_enable_uring("N", || run(false)) {
        Ok(()) => {}
        Err(why) => return corofuse_tests::require::report_skip(&why),
    }
    let _on = match corofuse_tests::uring::EnableUring::acquire() {
        Ok(on) => on,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    run(true);
}
