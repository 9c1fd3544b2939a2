//! Crash consistency of qcow2 exports: SIGKILL of the daemon while allocating writes are in
//! flight leaves an image that `qemu-img check` finds free of corruption (leaked clusters
//! are allowed: exit status 0 or 3), and every write that fdatasync(2) or fsync(2)
//! returned for through the mount before the kill reads back.
//!
//! Each round mounts the image again (so later rounds start from a killed one), keeps two
//! writers allocating clusters and punching holes in the second half of the disk, never
//! syncing, writes and syncs patterned batches into the first half, lets the writers run
//! on a little, then kills the daemon.
//!
//! v3 images carry the DIRTY bit while mounted writable, so every mount after a kill
//! repairs the image first, one log line; a last mount, stopped cleanly, leaves it with no
//! leaked cluster at all. v2 images have no DIRTY bit and keep their leaks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use corofuse_tests::export::{wait_for_progress, TIMEOUT};
use corofuse_tests::qcow2::{assert_check_clean, create, raw_contents};
use corofuse_tests::qemu::{describe, qemu};
use corofuse_tests::sys::fallocate;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_rw, pattern, require_tool, Dispatch, MountedExport, Rng,
    Sandbox, Seed, KIB, MIB,
};

const LEN: u64 = 8 * MIB;
const HALF: u64 = LEN / 2;
const ROUNDS: u64 = 3;

/// Allocating writes (and some hole punching) all over the second half, unsynced, until
/// the daemon is gone; counts the operations that returned.
fn unsynced_writer(mount: &Path, seed: u64, done: &AtomicU64) {
    let file = open_rw(mount).expect("open the mount");
    let mut rng = Rng::new(seed);
    for i in 0.. {
        let at = HALF + rng.below(HALF - 256 * KIB);
        let len = 1 + rng.below(200 * KIB);
        let ok = match i % 5 {
            4 => fallocate(
                &file,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                at,
                len,
            )
            .is_ok(),
            _ => file
                .write_all_at(&pattern(seed + i, at, len as usize), at)
                .is_ok(),
        };
        if !ok {
            return;
        }
        done.fetch_add(1, SeqCst);
    }
}

/// `qemu-img check`: no corruption (exit 0, or 3 for leaks only).
#[track_caller]
fn assert_not_corrupt(image: &Path, round: u64) {
    let out = qemu(
        "qemu-img",
        &["check", "-f", "qcow2", image.to_str().unwrap()],
    );
    let text = describe(&out);
    assert!(
        matches!(out.status.code(), Some(0 | 3)) && !text.contains("ERROR"),
        "round {round}: qemu-img check after SIGKILL: {text}"
    );
}

fn synced_writes_survive_sigkill(mode: Dispatch, opts: &str, backing: bool) {
    require_tool!("qemu-img");
    let seed = Seed::choose();
    let mut rng = seed.rng();
    let sandbox = Sandbox::new();
    let image = sandbox.path("crash.qcow2");
    let mut opts = opts.to_owned();
    let mut want = vec![0u8; HALF as usize];
    if backing {
        let base = pattern(9, 0, LEN as usize);
        want.copy_from_slice(&base[..HALF as usize]);
        let base = sandbox.file("base.raw", &base);
        opts += &format!(",backing_file={},backing_fmt=raw", base.display());
    }
    create(&image, &opts, Some("8M"));
    let v3 = opts.contains("compat=1.1");
    for round in 0..ROUNDS {
        let mut export = MountedExport::start(
            &image,
            &sandbox.mountpoint("mnt"),
            mode,
            &["-w", "--format", "qcow2"],
        );
        assert_repaired(&export, v3 && round > 0, round);
        let progress = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel();
        for w in 0..2 {
            let (mount, counter, tx) =
                (export.path().to_owned(), Arc::clone(&progress), tx.clone());
            let writer_seed = rng.next_u64() + w;
            // Not scoped: if the I/O hangs, the test fails instead of hanging with it.
            std::thread::spawn(move || {
                unsynced_writer(&mount, writer_seed, &counter);
                let _ = tx.send(());
            });
        }
        wait_for_progress(&progress, 3, "no progress of the unsynced writers");
        let file: File = open_rw(export.path()).expect("open the mount");
        for batch in 0..2 {
            for _ in 0..6 {
                let at = rng.below(HALF - 1);
                let len = (1 + rng.below(150 * KIB)).min(HALF - at) as usize;
                let data = pattern(rng.next_u64(), at, len);
                file.write_all_at(&data, at)
                    .expect("write through the mount");
                want[at as usize..][..len].copy_from_slice(&data);
            }
            match batch {
                0 => file.sync_data().expect("fdatasync"),
                _ => file.sync_all().expect("fsync"),
            }
        }
        let before_kill = progress.load(SeqCst);
        wait_for_progress(&progress, before_kill + 1 + rng.below(8), "writers stalled");
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        export.crash();
        drop(file);
        for _ in 0..2 {
            rx.recv_timeout(TIMEOUT)
                .expect("the writers stop when the daemon dies");
        }
        export.umount_after_crash();
        assert_not_corrupt(&image, round);
        let disk = raw_contents(&image);
        assert_bytes_eq(
            &disk[..HALF as usize],
            &want,
            &format!("synced half, round {round}"),
        );
    }
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
    assert_repaired(&export, v3, ROUNDS);
    export.stop();
    match v3 {
        true => assert_check_clean(&image, "after the repair and a clean stop"),
        false => assert_not_corrupt(&image, ROUNDS),
    }
}

/// The daemon logged one repair of a dirty image at open, or none (`repaired` false).
#[track_caller]
fn assert_repaired(export: &MountedExport, repaired: bool, round: u64) {
    let log = export.stderr();
    assert_eq!(
        log.matches("was dirty:").count(),
        repaired as usize,
        "round {round}: repairs logged:\n{log}"
    );
    if repaired {
        eprintln!(
            "round {round}: {}",
            log.lines().find(|l| l.contains("was dirty")).unwrap()
        );
    }
}

dispatch_tests!(mount_qcow2_crash_v3_64k [coroutine, threads]);
fn mount_qcow2_crash_v3_64k(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, "compat=1.1", false);
}

dispatch_tests!(mount_qcow2_crash_v2_4k_over_backing[coroutine]);
fn mount_qcow2_crash_v2_4k_over_backing(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, "compat=0.10,cluster_size=4k", true);
}

dispatch_tests!(mount_qcow2_crash_v3_512[coroutine]);
fn mount_qcow2_crash_v3_512(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, "compat=1.1,cluster_size=512", false);
}
