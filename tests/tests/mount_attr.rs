//! stat(2) through the mount: a regular file with the image's exact size, mode 0600 when
//! writable and 0400 read-only, and the backend's allocation in st_blocks.

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};

use corofuse_tests::{dispatch_tests, pattern, Dispatch, MountedExport, Sandbox, KIB, MIB};

/// Not a multiple of 512: QEMU rounds sizes to sectors, we must not.
const LEN: u64 = 3 * MIB + 4321;

/// A sparse image of [`LEN`] bytes with 64 KiB of data at 1 MiB.
fn sparse_image(sandbox: &Sandbox) -> std::path::PathBuf {
    let image = sandbox.sparse("disk.img", LEN);
    let file = fs::OpenOptions::new().write(true).open(&image).unwrap();
    file.write_all_at(&pattern(1, MIB, 64 * KIB as usize), MIB)
        .unwrap();
    file.sync_all().unwrap();
    image
}

fn check_stat(dispatch: Dispatch, args: &[&str], mode: u32) {
    let sandbox = Sandbox::new();
    let image = sparse_image(&sandbox);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), dispatch, args);
    let on_disk = fs::metadata(&image).unwrap();
    let st = fs::metadata(export.path()).unwrap();
    assert!(st.file_type().is_file(), "not a regular file: {st:?}");
    assert_eq!(st.len(), LEN, "size must be byte-exact");
    assert_eq!(st.mode() & 0o7777, mode, "permission bits of {args:?}");
    assert_eq!((st.nlink(), st.uid(), st.gid()), (1, 0, 0), "nlink, owner");
    assert_eq!(
        st.blocks(),
        on_disk.blocks(),
        "st_blocks must be the image's allocation"
    );
    assert!(
        st.blocks() * 512 < LEN / 4,
        "sparse image shows {} blocks",
        st.blocks()
    );
    export.stop();
}

dispatch_tests!(mount_stat_writable_is_0600_and_exact);
fn mount_stat_writable_is_0600_and_exact(mode: Dispatch) {
    check_stat(mode, &["-w"], 0o600);
}

dispatch_tests!(mount_stat_read_only_is_0400_and_exact);
fn mount_stat_read_only_is_0400_and_exact(mode: Dispatch) {
    check_stat(mode, &[], 0o400);
}

dispatch_tests!(mount_stat_blocks_of_a_full_image);
fn mount_stat_blocks_of_a_full_image(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sandbox.file("disk.img", &pattern(2, 0, LEN as usize));
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &[]);
    let st = fs::metadata(export.path()).unwrap();
    assert_eq!(st.blocks(), fs::metadata(&image).unwrap().blocks());
    assert!(
        st.blocks() * 512 >= LEN,
        "{} blocks for {LEN} bytes",
        st.blocks()
    );
    export.stop();
}

dispatch_tests!(mount_stat_allow_other_keeps_the_file_owner_only);
/// `--allow-other`: the kernel lets other users reach the mount, but the file stays
/// owner-only (`0400`, `0600` writable, as QEMU shows it) until its owner grants more
/// through the mount; `tests/tests/security.rs` checks what other users can then do.
fn mount_stat_allow_other_keeps_the_file_owner_only(dispatch: Dispatch) {
    let sandbox = Sandbox::new();
    let image = sparse_image(&sandbox);
    for (args, mode) in [
        (&["--allow-other"][..], 0o400),
        (&["-w", "--allow-other"][..], 0o600),
    ] {
        let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), dispatch, args);
        let st = fs::metadata(export.path()).unwrap();
        assert_eq!(st.mode() & 0o7777, mode, "{args:?}");
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == export.path().to_str())
            .expect("the mount in /proc/self/mounts");
        assert!(line.contains("allow_other"), "{line}");
        export.stop();
    }
}
