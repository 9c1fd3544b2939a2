//! Bytes through the mount: what is written, buffered or O_DIRECT, lands in the image byte
//! for byte, and reads return what the image held.

use std::fs;
use std::os::unix::fs::FileExt;

use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, open_rw, pattern, AlignedBuf, Dispatch,
    MountedExport, Sandbox, KIB, MIB,
};

const LEN: u64 = 4 * MIB;

dispatch_tests!(mount_reads_return_the_image + ring);
fn mount_reads_return_the_image(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let expected = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    assert_bytes_eq(
        &fs::read(export.path()).unwrap(),
        &expected,
        "buffered read",
    );
    let file = open_direct(export.path(), false).unwrap();
    let mut buf = AlignedBuf::zeroed(256 * KIB as usize);
    for offset in [0, 4 * KIB, MIB + 64 * KIB, LEN - 256 * KIB] {
        file.read_exact_at(&mut buf, offset).unwrap();
        let want = &expected[offset as usize..][..buf.len()];
        assert_bytes_eq(&buf, want, &format!("O_DIRECT read at {offset}"));
    }
    // Unaligned and crossing the end: short, not an error.
    let mut tail = vec![0u8; 10_000];
    let n = fs::File::open(export.path())
        .unwrap()
        .read_at(&mut tail, LEN - 777)
        .unwrap();
    assert_eq!(n, 777, "read crossing the end");
    assert_bytes_eq(&tail[..n], &expected[(LEN - 777) as usize..], "tail");
    drop(file);
    export.stop();
}

/// (offset, length) of writes: unaligned, page-aligned, and larger than one FUSE request
/// (max_write is 1 MiB), the last one ending exactly at the end of the image.
const WRITES: [(u64, usize); 6] = [
    (0, 1),
    (4095, 2),
    (8 * KIB, 64 * KIB as usize),
    (100_000, 12_345),
    (MIB, 2 * MIB as usize + 4096),
    (LEN - 4 * KIB, 4 * KIB as usize),
];

/// Writes [`WRITES`] (O_DIRECT ones rounded out to pages) through `mount`, updating
/// `model`; returns the expected image.
fn write_through(mount: &std::path::Path, mut model: Vec<u8>, direct: bool, seed: u64) -> Vec<u8> {
    let file = if direct {
        open_direct(mount, true).unwrap()
    } else {
        open_rw(mount).unwrap()
    };
    for (i, (offset, len)) in WRITES.into_iter().enumerate() {
        let (offset, len) = if direct {
            (offset / 4096 * 4096, len.next_multiple_of(4096))
        } else {
            (offset, len)
        };
        let data = pattern(seed + i as u64, offset, len);
        let buf = AlignedBuf::from_slice(&data);
        let n = file.write_at(&buf, offset).unwrap();
        assert_eq!(n, len, "write of {len} bytes at {offset}");
        model[offset as usize..][..len].copy_from_slice(&data);
    }
    model
}

fn check_writes(mode: Dispatch, args: &[&str], direct: bool) {
    check_writes_in(&Sandbox::new(), mode, args, direct);
}

fn check_writes_in(sandbox: &Sandbox, mode: Dispatch, args: &[&str], direct: bool) {
    let before = pattern(10, 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
    let expected = write_through(export.path(), before, direct, 20);
    // The image path is a different file: it shows the bytes while still mounted...
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image while mounted");
    // ...and the mount reads them back.
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "read back");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
}

dispatch_tests!(mount_buffered_writes_reach_the_image);
fn mount_buffered_writes_reach_the_image(mode: Dispatch) {
    check_writes(mode, &["-w"], false);
}

dispatch_tests!(mount_buffered_writes_on_disk_reach_the_image + ring);
/// A buffered image on a disk-backed file system: its writes are blocking `pwritev`s on the
/// loop, not the ring's (`FileBackend::write_ctx`).
fn mount_buffered_writes_on_disk_reach_the_image(mode: Dispatch) {
    let sandbox = match Sandbox::on_real_fs() {
        Ok(s) => s,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    check_writes_in(&sandbox, mode, &["-w"], false);
}

dispatch_tests!(mount_buffered_writes_on_disk_take_no_ring_write[coroutine]);
/// The same image in a coroutine: a WRITE submits no SQE of its own (io_uring would hand a
/// buffered ext4 write to an io-wq worker: issue 37); the one SQE per request left is the
/// next read of /dev/fuse.
fn mount_buffered_writes_on_disk_take_no_ring_write(mode: Dispatch) {
    let sandbox = match Sandbox::on_real_fs() {
        Ok(s) => s,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    let image = sandbox.sparse("disk.img", LEN);
    let stats = sandbox.path("stats.json");
    let stats_arg = stats.to_str().unwrap();
    let args = ["-w", "--stats", stats_arg];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    let file = open_direct(export.path(), true).unwrap();
    let data = AlignedBuf::from_slice(&pattern(7, 0, MIB as usize));
    for offset in (0..LEN).step_by(MIB as usize) {
        file.write_all_at(&data[..(64 * KIB) as usize], offset)
            .unwrap();
        file.write_all_at(&data, offset).unwrap();
    }
    drop(file);
    export.stop();
    assert_no_ring_io(&stats, "WRITE", 8);
}

dispatch_tests!(mount_large_buffered_reads_on_disk_take_no_ring_read[coroutine]);
/// A buffered image on a disk file system in a coroutine: a READ of 256 KiB or more is a
/// blocking `preadv` on the loop and submits no SQE of its own (through the ring, a read
/// the page cache does not hold completes piece by piece: issue 37); what it returns is
/// the image's, whole and at any offset.
fn mount_large_buffered_reads_on_disk_take_no_ring_read(mode: Dispatch) {
    let sandbox = match Sandbox::on_real_fs() {
        Ok(s) => s,
        Err(why) => return corofuse_tests::require::report_skip(&why),
    };
    let expected = pattern(11, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let stats = sandbox.path("stats.json");
    let args = ["--stats", stats.to_str().unwrap()];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    let file = open_direct(export.path(), false).unwrap();
    let mut buf = AlignedBuf::zeroed(MIB as usize);
    for offset in [0, MIB, 2 * MIB + 4 * KIB, LEN - MIB] {
        file.read_exact_at(&mut buf, offset).unwrap();
        let want = &expected[offset as usize..][..buf.len()];
        assert_bytes_eq(&buf, want, &format!("1 MiB read at {offset}"));
    }
    drop(file);
    export.stop();
    assert_no_ring_io(&stats, "READ", 4);
}

/// The export's `--stats` counted `count` requests of `op`, and each submitted no SQE of
/// its own: the one SQE per request left is the next read of /dev/fuse.
fn assert_no_ring_io(stats: &std::path::Path, op: &str, count: u64) {
    let counted = &corofuse_tests::export::read_stats(stats)["ops"][op];
    assert_eq!(counted["count"].as_u64(), Some(count), "{counted}");
    let sqes = counted["sqes_per_request"].as_f64().unwrap();
    assert!(
        sqes < 1.5,
        "{sqes} SQEs per {op}: the transfer went through the ring; {counted}"
    );
}

dispatch_tests!(mount_direct_writes_reach_the_image + ring);
fn mount_direct_writes_reach_the_image(mode: Dispatch) {
    check_writes(mode, &["-w"], true);
}

dispatch_tests!(mount_direct_image_takes_unaligned_writes);
/// `--direct`: the image is opened O_DIRECT; unaligned writes go through its bounce path.
fn mount_direct_image_takes_unaligned_writes(mode: Dispatch) {
    check_writes(mode, &["-w", "--direct"], false);
}

dispatch_tests!(mount_ring_replies_round_trip[coroutine]);
/// `--ring-replies`: a transport option of the coroutine mode only.
fn mount_ring_replies_round_trip(mode: Dispatch) {
    check_writes(mode, &["-w", "--ring-replies"], true);
}

dispatch_tests!(mount_eight_readers_round_trip[coroutine]);
/// `--readers`: a transport option of the coroutine mode only.
fn mount_eight_readers_round_trip(mode: Dispatch) {
    check_writes(mode, &["--writable", "--readers", "8"], false);
}

dispatch_tests!(mount_fsync_succeeds_and_data_is_in_the_image + ring);
fn mount_fsync_succeeds_and_data_is_in_the_image(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.sparse("disk.img", MIB);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let data = pattern(3, 12_288, 5000);
    file.write_all_at(&data, 12_288).unwrap();
    file.sync_data().expect("fdatasync through the mount");
    file.sync_all().expect("fsync through the mount");
    let on_disk = fs::read(&image).unwrap();
    assert_bytes_eq(&on_disk[12_288..][..5000], &data, "image after fsync");
    drop(file);
    export.stop();
}

dispatch_tests!(mount_over_the_image_itself);
/// MOUNTPOINT == IMAGE: the daemon opens the image first, then hides it under the mount.
fn mount_over_the_image_itself(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let before = pattern(4, 0, MIB as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &image, mode, &["-w"]);
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &before,
        "read through the mount",
    );
    let data = pattern(5, 300_000, 70_000);
    open_rw(&image)
        .unwrap()
        .write_all_at(&data, 300_000)
        .unwrap();
    export.stop();
    let mut expected = before;
    expected[300_000..370_000].copy_from_slice(&data);
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
}
