//! Release on unmount: once an export's mount is gone from /proc/mounts, its image has
//! been flushed and its locks released, so a new export of the same image started that
//! very moment opens it (what a script does after SIGTERM, or after QMP's
//! `block-export-del`, before it starts the next export). Every transport, 50 times in a
//! tight loop, writing through each export and checking what the previous one wrote.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use corofuse_tests::export::TIMEOUT;
use corofuse_tests::mountinfo::fuse_mounts_at;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, pattern, require_fuse, require_tool, AlignedBuf,
    Dispatch, MountedExport, Sandbox, MIB,
};

const LEN: u64 = 4 * MIB;
const CHUNK: usize = MIB as usize;
const ROUNDS: u64 = 50;

/// Writes round `round`'s pattern over the whole export, one direct 1 MiB write at a time.
fn write_round(mount: &Path, round: u64) {
    let file = open_direct(mount, true).expect("open the mount for writing");
    for offset in (0..LEN).step_by(CHUNK) {
        let data = AlignedBuf::from_slice(&pattern(round, offset, CHUNK));
        file.write_all_at(&data, offset)
            .expect("write through the mount");
    }
}

/// Checks that the export reads as round `round` wrote it.
fn check_round(mount: &Path, round: u64) {
    let file = open_direct(mount, false).expect("open the mount for reading");
    let mut back = AlignedBuf::zeroed(CHUNK);
    for offset in (0..LEN).step_by(CHUNK) {
        file.read_exact_at(&mut back, offset).unwrap_or_else(|e| {
            panic!(
                "round {round} at {offset}: {e}; size {:?}",
                file.metadata().map(|m| m.len())
            )
        });
        let what = format!("round {round}'s data at {offset}, read by the next export");
        assert_bytes_eq(&back, &pattern(round, offset, CHUNK), &what);
    }
}

/// SIGTERM, then returns the moment /proc/mounts no longer lists the mount (the daemon
/// may still be running: that is the point).
fn stop_until_unlisted(export: &mut MountedExport, before: usize) {
    export.signal(libc::SIGTERM);
    let start = Instant::now();
    while fuse_mounts_at(export.path()) > before {
        assert!(
            start.elapsed() < TIMEOUT,
            "the mount is still listed {TIMEOUT:?} after SIGTERM; {}",
            export.diagnose()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `rounds` exports of `image` one after the other, each started as soon as the one
/// before is unlisted, each checking the previous round's data and writing its own.
fn restart_in_a_loop(image: &Path, mountpoint: &Path, mode: Dispatch, args: &[&str], rounds: u64) {
    let before = fuse_mounts_at(mountpoint);
    let mut previous: Option<MountedExport> = None;
    for round in 0..rounds {
        let started = MountedExport::try_start(image, mountpoint, mode, args);
        let mut export = started.unwrap_or_else(|e| {
            let last = previous.as_ref().map(|p| p.stderr()).unwrap_or_default();
            panic!("round {round}: the next export did not start: {e}\nprevious daemon:\n{last}")
        });
        if let Some(mut old) = previous.take() {
            let status = old.wait_exit(TIMEOUT).expect("the previous daemon exits");
            assert!(status.success(), "{status}; stderr:\n{}", old.stderr());
            // The mount on the path is the new export's now: not for the guard to detach.
            old.released();
        }
        if round > 0 {
            check_round(export.path(), round - 1);
        }
        write_round(export.path(), round);
        stop_until_unlisted(&mut export, before);
        previous = Some(export);
    }
    if let Some(mut last) = previous {
        let status = last.wait_exit(TIMEOUT).expect("the last daemon exits");
        assert!(status.success(), "{status}; stderr:\n{}", last.stderr());
        last.assert_unmounted();
    }
}

dispatch_tests!(mount_restart_as_soon_as_unlisted_finds_the_image_free);
fn mount_restart_as_soon_as_unlisted_finds_the_image_free(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.sparse("disk.img", LEN);
    let mountpoint = sandbox.mountpoint("mnt");
    restart_in_a_loop(&image, &mountpoint, mode, &["-w"], ROUNDS);
    let file = std::fs::File::open(&image).unwrap();
    let mut last = vec![0u8; CHUNK];
    file.read_exact_at(&mut last, LEN - CHUNK as u64).unwrap();
    let expected = pattern(ROUNDS - 1, LEN - CHUNK as u64, CHUNK);
    assert_bytes_eq(&last, &expected, "the image after the last export");
}

/// A qcow2 image's closing writes (the freed clusters, the DIRTY bit) are done, and its
/// locks dropped, before the mount goes: the next export opens a clean image.
#[test]
fn mount_restart_qcow2_is_closed_before_the_mount_goes() {
    require_fuse!();
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let image = sandbox.path("disk.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&image)
        .arg(LEN.to_string())
        .output()
        .expect("qemu-img create");
    assert!(made.status.success(), "{made:?}");
    let mountpoint = sandbox.mountpoint("mnt");
    restart_in_a_loop(&image, &mountpoint, Dispatch::Coroutine, &["-w"], 20);
    let check = std::process::Command::new("qemu-img")
        .args(["check", "-q"])
        .arg(&image)
        .output()
        .expect("qemu-img check");
    assert!(check.status.success(), "qemu-img check: {check:?}");
}
