//! `null:SIZE`: an exact size, zeroes on read, writes refused read-only and dropped with -w.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};

use corofuse_tests::{
    dispatch_tests, errno_of, open_direct, open_rw, AlignedBuf, Dispatch, MountedExport, Sandbox,
    MIB,
};

fn reads_zeroes(path: &std::path::Path, len: u64) {
    let file = open_direct(path, false).unwrap();
    let mut buf = AlignedBuf::zeroed(MIB as usize);
    for offset in [0, 7 * MIB, len - MIB] {
        buf.fill(0xA5);
        file.read_exact_at(&mut buf, offset).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "non-zero byte at {offset}");
    }
    let mut past = [0xA5u8; 512];
    assert_eq!(file.read_at(&mut past, len).unwrap(), 0, "read at the end");
}

dispatch_tests!(mount_null_read_only);
fn mount_null_read_only(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let export = MountedExport::start("null:1G", &sandbox.mountpoint("mnt"), mode, &[]);
    let st = fs::metadata(export.path()).unwrap();
    assert_eq!((st.len(), st.mode() & 0o7777), (1 << 30, 0o400));
    assert_eq!(st.blocks(), 0, "null allocates nothing");
    reads_zeroes(export.path(), 1 << 30);
    assert_eq!(errno_of(open_rw(export.path()), "open O_RDWR"), libc::EROFS);
    export.stop();
}

dispatch_tests!(mount_null_writable_drops_writes);
fn mount_null_writable_drops_writes(mode: Dispatch) {
    let sandbox = Sandbox::new();
    // 12345 bytes past 16 MiB: an odd size, byte-exact.
    let len = 16 * MIB + 12_345;
    let spec = format!("null:{len}");
    let export = MountedExport::start(&spec, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    assert_eq!(fs::metadata(export.path()).unwrap().len(), len);
    let file = open_direct(export.path(), true).unwrap();
    let ones = AlignedBuf::from_slice(&[1u8; 65536]);
    assert_eq!(file.write_at(&ones, 0).unwrap(), ones.len());
    assert_eq!(file.write_at(&ones, 8 * MIB).unwrap(), ones.len());
    file.sync_all().unwrap();
    drop(file);
    reads_zeroes(export.path(), len);
    assert_eq!(fs::metadata(export.path()).unwrap().len(), len);
    export.stop();
}
