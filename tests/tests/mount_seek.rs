//! SEEK_DATA / SEEK_HOLE through the mount answer what the image's own file system says.

use std::fs::File;
use std::os::unix::fs::FileExt;

use corofuse_tests::sys::{assert_same_seeks, seek};
use corofuse_tests::{dispatch_tests, pattern, Dispatch, MountedExport, Sandbox, KIB, MIB};

const LEN: u64 = 2 * MIB;

dispatch_tests!(mount_seek_data_and_hole_match_the_image);
fn mount_seek_data_and_hole_match_the_image(mode: Dispatch) {
    let sandbox = Sandbox::on_tmpfs().unwrap_or_default();
    // data 0..64K, hole 64K..1M, data 1M..1M+64K, hole to 2M.
    let image = sandbox.sparse("disk.img", LEN);
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    for at in [0, MIB] {
        writer
            .write_all_at(&pattern(at, at, 64 * KIB as usize), at)
            .unwrap();
    }
    writer.sync_all().unwrap();
    drop(writer);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    let on_image = File::open(&image).unwrap();
    let on_mount = File::open(export.path()).unwrap();
    // The image's file system must see the hole, or the comparison proves little.
    assert_eq!(
        seek(&on_image, 0, libc::SEEK_HOLE),
        Ok(64 * KIB),
        "image layout"
    );
    let offsets = [
        0,
        1,
        4095,
        64 * KIB - 1,
        64 * KIB,
        100 * KIB,
        MIB - 1,
        MIB,
        MIB + 4 * KIB,
        MIB + 64 * KIB - 1,
        MIB + 64 * KIB,
        LEN - 1,
        LEN,
        LEN + 1,
        3 * MIB,
    ];
    assert_same_seeks(&on_image, &on_mount, &offsets, "image");
    assert_eq!(seek(&on_mount, LEN, libc::SEEK_DATA), Err(libc::ENXIO));
    assert_eq!(seek(&on_mount, MIB - 1, libc::SEEK_DATA), Ok(MIB));
    assert_eq!(seek(&on_mount, MIB, libc::SEEK_HOLE), Ok(MIB + 64 * KIB));
    drop(on_mount);
    export.stop();
}
