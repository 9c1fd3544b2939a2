//! qcow2 images through a real mount: the exported file reads as `qemu-img convert -O raw`
//! gives; `--format raw` exports the container instead; and the image keeps QEMU's locks
//! (the image a writer's, its backing file a reader's).

use std::fs;

use corofuse_tests::qcow2::{qemu_img, raw_contents, variants};
use corofuse_tests::qemu::{describe, qemu};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, require_tool, Dispatch, MountedExport, Sandbox,
};

dispatch_tests!(mount_qcow2_reads_like_qemu_img [coroutine, inline, threads, uring]);
fn mount_qcow2_reads_like_qemu_img(mode: Dispatch) {
    require_tool!("qemu-img", "qemu-io");
    let sandbox = Sandbox::new();
    let dir = sandbox.path("images");
    fs::create_dir(&dir).unwrap();
    let wanted = [
        "v3 512",
        "v2 4k zlib",
        "v3 64k zstd",
        "v2 over qcow2",
        "v2 2M",
    ];
    for v in variants(&dir)
        .iter()
        .filter(|v| wanted.contains(&v.name.as_str()))
    {
        let want = raw_contents(&v.path);
        let export = MountedExport::start(&v.path, &sandbox.mountpoint("mnt"), mode, &[]);
        assert_bytes_eq(&fs::read(export.path()).unwrap(), &want, &v.name);
        export.stop();
    }
}

dispatch_tests!(mount_qcow2_format_raw_exports_the_container[coroutine]);
fn mount_qcow2_format_raw_exports_the_container(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let image = sandbox.path("c.qcow2");
    qemu_img(&["create", "-f", "qcow2", image.to_str().unwrap(), "1M"]);
    let container = fs::read(&image).unwrap();
    let mnt = sandbox.mountpoint("mnt");
    let export = MountedExport::start(&image, &mnt, mode, &["--format", "raw"]);
    assert_bytes_eq(
        &fs::read(export.path()).unwrap(),
        &container,
        "--format raw",
    );
    export.stop();
    let export = MountedExport::start(&image, &mnt, mode, &["--format", "qcow2"]);
    assert_eq!(fs::read(export.path()).unwrap(), vec![0u8; 1 << 20]);
    export.stop();
}

dispatch_tests!(mount_qcow2_keeps_qemu_locks_on_image_and_backing[coroutine]);
fn mount_qcow2_keeps_qemu_locks_on_image_and_backing(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let base = sandbox.file("base.raw", &vec![7u8; 1 << 20]);
    let image = sandbox.path("top.qcow2");
    let opts = format!("backing_file={},backing_fmt=raw", base.display());
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        &opts,
        image.to_str().unwrap(),
    ]);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    // A writer on the image is refused; the backing file may still be read, not written.
    let write_top = qemu("qemu-io", &["-c", "write 0 512", image.to_str().unwrap()]);
    assert!(
        !write_top.status.success(),
        "qemu-io wrote the exported image"
    );
    let read_base = qemu("qemu-img", &["info", "-f", "raw", base.to_str().unwrap()]);
    assert!(
        read_base.status.success(),
        "qemu-img info on the backing file: {}",
        describe(&read_base)
    );
    let write_base = qemu(
        "qemu-io",
        &["-f", "raw", "-c", "write 0 512", base.to_str().unwrap()],
    );
    assert!(
        !write_base.status.success(),
        "qemu-io wrote the backing file under a reader"
    );
    assert_eq!(fs::read(export.path()).unwrap(), vec![7u8; 1 << 20]);
    export.stop();
}
