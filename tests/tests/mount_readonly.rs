//! The default export is read-only, as in QEMU: every way of modifying the image fails
//! (with EROFS where the request reaches the daemon, even for root) and the image keeps
//! its bytes and size.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

use corofuse_tests::sys::{fallocate, truncate};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_rw, pattern, Dispatch, MountedExport, Sandbox,
    MIB,
};

dispatch_tests!(mount_read_only_refuses_every_modification);
fn mount_read_only_refuses_every_modification(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let before = pattern(1, 0, 2 * MIB as usize);
    let image = sandbox.file("disk.img", &before);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    let mnt = export.path();

    assert_eq!(errno_of(open_rw(mnt), "open O_RDWR"), libc::EROFS);
    let wronly = fs::OpenOptions::new().write(true).open(mnt);
    assert_eq!(errno_of(wronly, "open O_WRONLY"), libc::EROFS);
    let trunc = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(mnt);
    assert!(trunc.is_err(), "open O_RDONLY|O_TRUNC must fail");
    assert_eq!(errno_of(fs::write(mnt, b"x"), "fs::write"), libc::EROFS);

    // truncate(2) by path: SETATTR with a size.
    let shrink = File::open(mnt).and_then(|f| f.set_len(MIB));
    assert!(shrink.is_err(), "ftruncate on a read-only fd must fail");
    for len in [0, MIB, 4 * MIB] {
        let err = errno_of(truncate(mnt, len), "truncate(2)");
        assert_eq!(err, libc::EROFS, "truncate to {len}");
    }

    // No write access, so fallocate and write(2) are refused by the kernel already.
    let ro = File::open(mnt).unwrap();
    assert!(fallocate(&ro, 0, 0, 4096).is_err(), "fallocate");
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert!(fallocate(&ro, punch, 0, 4096).is_err(), "punch hole");
    assert!(std::os::unix::fs::FileExt::write_at(&ro, b"x", 0).is_err());

    // Write bits cannot be added: the mode reports what the export allows.
    let chmod = fs::set_permissions(mnt, fs::Permissions::from_mode(0o600));
    assert_eq!(errno_of(chmod, "chmod 0600"), libc::EROFS);
    assert_eq!(fs::metadata(mnt).unwrap().mode() & 0o7777, 0o400);
    drop(ro);

    assert_bytes_eq(&fs::read(mnt).unwrap(), &before, "read through the mount");
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &before, "image after unmount");
}
