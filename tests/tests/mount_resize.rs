//! Size changes: a growable export grows with writes past the end, truncation and
//! fallocate; a fixed-size one refuses writes past the end (ENOSPC) and shortens writes
//! that straddle it, leaving the size alone.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use corofuse_tests::sys::fallocate;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_direct, open_rw, pattern, AlignedBuf, Dispatch,
    MountedExport, Sandbox, KIB, MIB,
};

/// An odd size, so that every end is unaligned.
const LEN: u64 = MIB + 100;

/// The size seen through the mount and in the image, which must agree.
#[track_caller]
fn assert_size(export: &MountedExport, image: &Path, len: u64, what: &str) {
    let seen = (
        fs::metadata(export.path()).unwrap().len(),
        fs::metadata(image).unwrap().len(),
    );
    assert_eq!(seen, (len, len), "{what}: (mount, image) sizes");
}

fn growable(sandbox: &Sandbox, mode: Dispatch) -> (MountedExport, std::path::PathBuf, Vec<u8>) {
    let before = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--growable"],
    );
    (export, image, before)
}

dispatch_tests!(mount_growable_write_past_the_end_grows_to_the_byte);
fn mount_growable_write_past_the_end_grows_to_the_byte(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let (export, image, mut expected) = growable(&sandbox, mode);
    let file = open_rw(export.path()).unwrap();
    let data = pattern(2, LEN + 1000, 4096);
    assert_eq!(file.write_at(&data, LEN + 1000).unwrap(), 4096);
    assert_size(&export, &image, LEN + 5096, "after a write past the end");
    expected.resize(LEN as usize + 1000, 0);
    expected.extend_from_slice(&data);
    // An O_DIRECT write at the new end grows it again, by a page.
    let direct = open_direct(export.path(), true).unwrap();
    let page = AlignedBuf::from_slice(&pattern(3, 0, 4096));
    let end = expected.len() as u64;
    let at = end.next_multiple_of(4096);
    assert_eq!(direct.write_at(&page, at).unwrap(), 4096);
    assert_size(&export, &image, at + 4096, "after an O_DIRECT write");
    expected.resize(at as usize, 0);
    expected.extend_from_slice(&page);
    drop((file, direct));
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}

dispatch_tests!(mount_growable_truncate_shrinks_and_grows);
fn mount_growable_truncate_shrinks_and_grows(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let (export, image, before) = growable(&sandbox, mode);
    let file = open_rw(export.path()).unwrap();
    file.set_len(300_001).unwrap();
    assert_size(&export, &image, 300_001, "after shrinking");
    file.set_len(2 * MIB + 7).unwrap();
    assert_size(&export, &image, 2 * MIB + 7, "after growing");
    let mut expected = before[..300_001].to_vec();
    expected.resize((2 * MIB + 7) as usize, 0);
    drop(file);
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}

dispatch_tests!(mount_growable_fallocate_at_eof_grows_by_the_length);
fn mount_growable_fallocate_at_eof_grows_by_the_length(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let (export, image, mut expected) = growable(&sandbox, mode);
    let file = open_rw(export.path()).unwrap();
    fallocate(&file, 0, LEN, 64 * KIB + 3).expect("fallocate(0) at EOF");
    assert_size(
        &export,
        &image,
        LEN + 64 * KIB + 3,
        "after fallocate at EOF",
    );
    fallocate(&file, 0, 4096, 8192).expect("fallocate(0) inside");
    assert_size(
        &export,
        &image,
        LEN + 64 * KIB + 3,
        "after fallocate inside",
    );
    expected.resize((LEN + 64 * KIB + 3) as usize, 0);
    drop(file);
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}

dispatch_tests!(mount_fixed_size_refuses_writes_past_the_end);
fn mount_fixed_size_refuses_writes_past_the_end(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let mut expected = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let data = pattern(2, 0, 4096);
    for at in [LEN, LEN + 1, LEN + MIB] {
        let err = errno_of(file.write_at(&data, at), "write past the end");
        assert_eq!(err, libc::ENOSPC, "write at {at}");
    }
    // Straddling the end: short, up to the end.
    assert_eq!(
        file.write_at(&data, LEN - 100).unwrap(),
        100,
        "straddling write"
    );
    expected[(LEN - 100) as usize..].copy_from_slice(&data[..100]);
    assert_size(&export, &image, LEN, "after writes at the end");
    // O_DIRECT: the last (partial) page straddles the end too.
    let direct = open_direct(export.path(), true).unwrap();
    let page = AlignedBuf::from_slice(&pattern(3, 0, 4096));
    let last = LEN / 4096 * 4096;
    assert_eq!(direct.write_at(&page, last).unwrap(), (LEN - last) as usize);
    expected[last as usize..].copy_from_slice(&page[..(LEN - last) as usize]);
    // Preallocation inside the file changes nothing.
    fallocate(&file, 0, 0, 8192).expect("fallocate(0) inside");
    assert_size(&export, &image, LEN, "after all of it");
    drop((file, direct));
    assert_bytes_eq(&fs::read(export.path()).unwrap(), &expected, "mount");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
}

dispatch_tests!(mount_fixed_size_truncate_and_fallocate_cannot_grow);
/// The CLI contract: "--growable: writes and truncation past the end resize the image".
/// Without it, nothing may grow a fixed-size export (QEMU, unlike this contract, lets
/// truncate and fallocate grow any writable export).
fn mount_fixed_size_truncate_and_fallocate_cannot_grow(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let expected = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let file = open_rw(export.path()).unwrap();
    let grown = file.set_len(LEN + 4096);
    assert_size(&export, &image, LEN, "after truncate past the end");
    assert_eq!(
        grown.unwrap_err().raw_os_error(),
        Some(libc::EFBIG),
        "truncate past the end"
    );
    let grown = fallocate(&file, 0, LEN, 4096);
    assert_size(&export, &image, LEN, "after fallocate(0) at the end");
    assert!(grown.is_err(), "fallocate(0) at the end succeeded");
    let zeroed = fallocate(&file, libc::FALLOC_FL_ZERO_RANGE, LEN, 4096);
    assert_size(&export, &image, LEN, "after ZERO_RANGE at the end");
    assert!(zeroed.is_err(), "ZERO_RANGE past the end succeeded");
    // Shrinking needs only a writable export.
    file.set_len(LEN - 4096).unwrap();
    assert_size(&export, &image, LEN - 4096, "after shrinking");
    drop(file);
    export.stop();
    assert_bytes_eq(
        &fs::read(&image).unwrap(),
        &expected[..LEN as usize - 4096],
        "image",
    );
}
