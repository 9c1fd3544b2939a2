//! Zeroing through the mount: PUNCH_HOLE|KEEP_SIZE deallocates (the image's st_blocks
//! drop) and reads back zeroes; ZERO_RANGE reads back zeroes; neither changes the size.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};

use corofuse_tests::sys::fallocate;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_rw, pattern, Dispatch, MountedExport, Sandbox, KIB, MIB,
};

const LEN: u64 = 4 * MIB;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

/// tmpfs where there is one (punching works everywhere there), else the temp dir.
fn sandbox() -> Sandbox {
    Sandbox::on_tmpfs().unwrap_or_default()
}

dispatch_tests!(mount_punch_hole_deallocates_and_reads_zeroes);
fn mount_punch_hole_deallocates_and_reads_zeroes(mode: Dispatch) {
    let sandbox = sandbox();
    let mut expected = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let blocks_before = fs::metadata(&image).unwrap().blocks();
    assert!(
        blocks_before * 512 >= LEN,
        "the image starts fully allocated"
    );
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    fallocate(&file, PUNCH, MIB, MIB).expect("punch 1 MiB");
    // Unaligned edges: the partial pages must be zeroed, not just left alone.
    fallocate(&file, PUNCH, 3 * MIB + 1000, 10_000).expect("punch unaligned");
    // Past the end with KEEP_SIZE: clamped, the size stays.
    fallocate(&file, PUNCH, LEN - 4 * KIB, MIB).expect("punch across the end");
    for (offset, len) in [
        (MIB, MIB),
        (3 * MIB + 1000, 10_000),
        (LEN - 4 * KIB, 4 * KIB),
    ] {
        expected[offset as usize..][..len as usize].fill(0);
    }
    let mut zeroes = vec![0xA5u8; MIB as usize];
    file.read_exact_at(&mut zeroes, MIB).unwrap();
    assert!(zeroes.iter().all(|&b| b == 0), "punched range reads zeroes");
    drop(file);
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    let on_disk = fs::metadata(&image).unwrap();
    assert_eq!(on_disk.len(), LEN, "KEEP_SIZE keeps the size");
    assert!(
        on_disk.blocks() + MIB / 512 <= blocks_before,
        "st_blocks {} -> {}: at least 1 MiB must be deallocated",
        blocks_before,
        on_disk.blocks()
    );
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}

dispatch_tests!(mount_zero_range_reads_zeroes);
fn mount_zero_range_reads_zeroes(mode: Dispatch) {
    let sandbox = sandbox();
    let mut expected = pattern(2, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let ranges = [(0, 4 * KIB), (MIB + 123, 300_000), (2 * MIB, MIB)];
    for (offset, len) in ranges {
        fallocate(&file, libc::FALLOC_FL_ZERO_RANGE, offset, len).expect("ZERO_RANGE");
        expected[offset as usize..][..len as usize].fill(0);
    }
    let keep = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
    fallocate(&file, keep, LEN - 100, 4 * KIB).expect("ZERO_RANGE|KEEP_SIZE across the end");
    expected[(LEN - 100) as usize..].fill(0);
    drop(file);
    assert_eq!(fs::metadata(export.path()).unwrap().len(), LEN);
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    export.stop();
    assert_eq!(fs::metadata(&image).unwrap().len(), LEN);
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}
