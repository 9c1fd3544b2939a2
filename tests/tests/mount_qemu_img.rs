//! qemu-img against the mount: `convert -n -t none` (O_DIRECT, zero detection, write
//! zeroes) into a writable export, then `compare` and `info`.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, pattern, require_tool, Dispatch, MountedExport, Sandbox, KIB,
    MIB,
};

const LEN: u64 = 8 * MIB;

#[track_caller]
fn qemu_img(args: &[&str], files: &[&Path]) -> Output {
    let out = Command::new("qemu-img")
        .args(args)
        .args(files)
        .output()
        .expect("run qemu-img");
    assert!(
        out.status.success(),
        "qemu-img {args:?} {files:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A source with data, explicit zeroes and holes, so that convert both copies and zeroes.
fn source(sandbox: &Sandbox) -> (std::path::PathBuf, Vec<u8>) {
    let path = sandbox.sparse("src.img", LEN);
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut bytes = vec![0u8; LEN as usize];
    for (offset, len) in [
        (0, MIB),
        (2 * MIB + 512, 300 * KIB),
        (LEN - 64 * KIB, 64 * KIB),
    ] {
        let data = pattern(offset, offset, len as usize);
        file.write_all_at(&data, offset).unwrap();
        bytes[offset as usize..][..len as usize].copy_from_slice(&data);
    }
    file.write_all_at(&vec![0u8; MIB as usize], 5 * MIB)
        .unwrap();
    (path, bytes)
}

dispatch_tests!(mount_qemu_img_convert_compare_info);
fn mount_qemu_img_convert_compare_info(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let (src, expected) = source(&sandbox);
    // The target starts full of non-zero bytes: every zero must be written.
    let image = sandbox.file("disk.img", &vec![0xAAu8; LEN as usize]);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    let mnt = export.path();
    qemu_img(
        &["convert", "-n", "-f", "raw", "-O", "raw", "-t", "none"],
        &[&src, mnt],
    );
    qemu_img(&["compare", "-f", "raw", "-F", "raw"], &[&src, mnt]);
    let info = qemu_img(&["info", "-f", "raw", "--output=json"], &[mnt]);
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.contains(&format!("\"virtual-size\": {LEN}")) && info.contains("\"format\": \"raw\""),
        "qemu-img info:\n{info}"
    );
    // Without -f: qemu-img probes the format through the mount.
    let probed = qemu_img(&["info"], &[mnt]);
    assert!(String::from_utf8_lossy(&probed.stdout).contains("file format: raw"));
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
}
