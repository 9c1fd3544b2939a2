//! qcow2 images through a real mount: the exported file reads as `qemu-img convert -O raw`
//! gives; `--format raw` exports the container instead; and the image keeps QEMU's locks
//! (the image a writer's, its backing file a reader's); random writes through the mount
//! leave an image that `qemu-img check` finds clean and `qemu-img compare` identical to a
//! raw image that got the same writes.

use std::fs;
use std::os::unix::fs::FileExt;

use corofuse_tests::qcow2::{
    assert_check_clean, assert_same_as_raw, assert_virtual_size, create, qemu_img, raw_contents,
    snapshot_contents, variants,
};
use corofuse_tests::qemu::{describe, qemu};
use corofuse_tests::sys::{fallocate, truncate};
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_rw, pattern, require_tool, Dispatch,
    MountedExport, Sandbox, Seed, KIB, MIB,
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
        let export = MountedExport::start(
            &v.path,
            &sandbox.mountpoint("mnt"),
            mode,
            &["--format", "qcow2"],
        );
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
    create(&image, &opts, None);
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
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

/// Random writes, zeroing and hole punching through a writable mount, mirrored into a raw
/// file; after unmount `qemu-img check` is clean and `qemu-img compare` says identical.
fn random_writes_through_the_mount(mode: Dispatch, opts: &str, backing: bool) {
    require_tool!("qemu-img");
    let seed = Seed::choose();
    let mut rng = seed.rng();
    let sandbox = Sandbox::new();
    let len = 4 * MIB;
    let image = sandbox.path("w.qcow2");
    let mirror = sandbox.sparse("mirror.raw", len);
    let mut opts = opts.to_owned();
    if backing {
        let base = sandbox.file("base.raw", &pattern(3, 0, len as usize));
        fs::copy(&base, &mirror).unwrap();
        opts += &format!(",backing_file={},backing_fmt=raw", base.display());
    }
    create(&image, &opts, Some("4M"));
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
    let file = open_rw(export.path()).unwrap();
    let raw = open_rw(&mirror).unwrap();
    for _ in 0..80 {
        let at = rng.below(len);
        let n = (1 + rng.below(150 * KIB)).min(len - at);
        match rng.below(8) {
            0 => {
                fallocate(
                    &file,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    at,
                    n,
                )
                .unwrap();
                raw.write_all_at(&vec![0u8; n as usize], at).unwrap();
            }
            1 => file.sync_data().unwrap(),
            _ => {
                let data = pattern(rng.next_u64(), at, n as usize);
                file.write_all_at(&data, at).unwrap();
                raw.write_all_at(&data, at).unwrap();
            }
        }
    }
    file.sync_all().unwrap();
    drop(file);
    export.stop();
    assert_check_clean(&image, "after random writes");
    assert_same_as_raw(&image, &mirror, "after random writes");
}

dispatch_tests!(mount_qcow2_random_writes_v3_over_backing [coroutine, threads]);
fn mount_qcow2_random_writes_v3_over_backing(mode: Dispatch) {
    random_writes_through_the_mount(mode, "compat=1.1", true);
}

dispatch_tests!(mount_qcow2_random_writes_v2_4k [coroutine, inline]);
fn mount_qcow2_random_writes_v2_4k(mode: Dispatch) {
    random_writes_through_the_mount(mode, "compat=0.10,cluster_size=4k", false);
}

dispatch_tests!(mount_qcow2_fio_randwrite_verify [coroutine, threads]);
/// fio verifies what it wrote at iodepth 16 into a fresh qcow2 image (every write an
/// allocating one at first); afterwards the image checks clean.
fn mount_qcow2_fio_randwrite_verify(mode: Dispatch) {
    require_tool!("qemu-img", "fio");
    let sandbox = Sandbox::new();
    let image = sandbox.path("fio.qcow2");
    create(&image, "compat=1.1", Some("16M"));
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
    corofuse_tests::fio::randwrite_verify(export.path(), "16M", &sandbox.path(""));
    export.stop();
    assert_check_clean(&image, "after fio");
}

dispatch_tests!(mount_qcow2_serving_requests_allocates_nothing [coroutine, threads]);
/// No heap allocation per request in steady state on a qcow2 image either (its clusters
/// compressed at first: the warm-up's writes turn them into data clusters).
fn mount_qcow2_serving_requests_allocates_nothing(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let raw = sandbox.file("src.raw", &pattern(3, 0, 4 * MIB as usize));
    let image = sandbox.path("disk.qcow2");
    qemu_img(&[
        "convert",
        "-c",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        image.to_str().unwrap(),
    ]);
    let stats = sandbox.path("stats.json");
    let args = ["-w", "--stats", stats.to_str().unwrap()];
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    corofuse_tests::export::assert_4k_io_allocates_nothing(&mut export, &stats);
    export.stop();
    assert_check_clean(&image, "after serving");
}

dispatch_tests!(mount_qcow2_truncate_grows_and_never_shrinks[coroutine]);
/// Through a growable export, truncate(2) grows the qcow2 disk (moving its L1 table) and
/// is refused for shrinking; a write past the end grows it to the next whole sector.
fn mount_qcow2_truncate_grows_and_never_shrinks(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let image = sandbox.path("t.qcow2");
    create(&image, "compat=1.1", Some("1M"));
    let mnt = sandbox.mountpoint("mnt");
    let export = MountedExport::start(&image, &mnt, mode, &["-w", "--growable"]);
    truncate(export.path(), 1 << 30).unwrap();
    assert_eq!(fs::metadata(export.path()).unwrap().len(), 1 << 30);
    let file = open_rw(export.path()).unwrap();
    file.write_all_at(b"end", (1 << 30) - 3).unwrap();
    let shrink = errno_of(truncate(export.path(), 1 << 20), "shrink");
    assert_eq!(shrink, libc::EOPNOTSUPP);
    file.write_all_at(b"past", (1 << 30) + 100).unwrap();
    assert_eq!(fs::metadata(export.path()).unwrap().len(), (1 << 30) + 512);
    drop(file);
    export.stop();
    assert_check_clean(&image, "after truncate");
    assert_virtual_size(&image, (1 << 30) + 512);
}

dispatch_tests!(mount_qcow2_qemu_img_convert_into_the_export [coroutine, threads]);
/// `qemu-img convert -n -t none` of a raw image into the export of an empty qcow2 image
/// (O_DIRECT writes, zero detection, write-zeroes), then the qcow2 image holds the raw
/// image's disk and checks clean.
fn mount_qcow2_qemu_img_convert_into_the_export(mode: Dispatch) {
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let dir = sandbox.path("src");
    fs::create_dir(&dir).unwrap();
    let src = corofuse_tests::qcow2::source(&dir);
    // Whole 4 KiB blocks: -t none writes them so, and the export is not growable.
    let len = 6 * MIB;
    fs::OpenOptions::new()
        .write(true)
        .open(&src)
        .unwrap()
        .set_len(len)
        .unwrap();
    let image = sandbox.path("target.qcow2");
    create(&image, "compat=1.1", Some(&len.to_string()));
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
    let (from, to) = (src.to_str().unwrap(), export.path().to_str().unwrap());
    qemu_img(&[
        "convert", "-n", "-f", "raw", "-O", "raw", "-t", "none", from, to,
    ]);
    export.stop();
    assert_check_clean(&image, "after convert");
    assert_same_as_raw(&image, &src, "after convert");
}

dispatch_tests!(mount_qcow2_discards_give_the_host_space_back [coroutine, threads]);
/// Space given back: 8 MiB written through the export, then discarded (PUNCH_HOLE through
/// the mount) and flushed: the image file's allocated blocks (what `du` shows) fall by
/// about as much, the disk reads zeroes there, and `qemu-img check` finds it clean.
fn mount_qcow2_discards_give_the_host_space_back(mode: Dispatch) {
    use std::os::unix::fs::MetadataExt;
    require_tool!("qemu-img");
    let sandbox = Sandbox::new();
    let image = sandbox.path("d.qcow2");
    create(&image, "compat=1.1", Some("64M"));
    let export = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "qcow2"],
    );
    let file = open_rw(export.path()).unwrap();
    let data = pattern(7, 4 * MIB, (8 * MIB) as usize);
    file.write_all_at(&data, 4 * MIB).unwrap();
    file.sync_all().unwrap();
    let written = fs::metadata(&image).unwrap().blocks() * 512;
    fallocate(
        &file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        4 * MIB,
        8 * MIB,
    )
    .unwrap();
    file.sync_all().unwrap();
    let punched = fs::metadata(&image).unwrap().blocks() * 512;
    assert!(
        written - punched >= 7 * MIB,
        "{mode}: {written} bytes allocated after the writes, {punched} after the discard"
    );
    let mut back = vec![1u8; (8 * MIB) as usize];
    file.read_exact_at(&mut back, 4 * MIB).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "{mode}: zeroes after the discard"
    );
    drop(file);
    export.stop();
    assert_check_clean(&image, "after discards");
}

dispatch_tests!(mount_qcow2_snapshots [coroutine, threads]);
/// An image with internal snapshots: `--snapshot` exports each read-only, as `qemu-img
/// convert -l` reads it (by ID and by name); the active state takes writes that leave
/// `qemu-img check` clean and every snapshot as it was; `-w --snapshot` and an unknown
/// snapshot are refused in one line.
fn mount_qcow2_snapshots(mode: Dispatch) {
    require_tool!("qemu-img", "qemu-io");
    let seed = Seed::choose();
    let mut rng = seed.rng();
    let sandbox = Sandbox::new();
    let (shape, opts) = corofuse_tests::qcow2::SNAPSHOT_SHAPES[0];
    let image = corofuse_tests::qcow2::with_snapshots(&sandbox.path(""), shape, opts);
    let mnt = sandbox.mountpoint("mnt");
    let before: Vec<Vec<u8>> = ["1", "2"]
        .iter()
        .map(|k| snapshot_contents(&image, k))
        .collect();
    for (key, want) in [("first", &before[0]), ("2", &before[1])] {
        let export = MountedExport::start(&image, &mnt, mode, &["--snapshot", key]);
        assert_bytes_eq(&fs::read(export.path()).unwrap(), want, key);
        let errno = errno_of(open_rw(export.path()), "open a snapshot for writing");
        assert!(
            matches!(errno, libc::EROFS | libc::EACCES),
            "opening snapshot {key} for writing: errno {errno}"
        );
        export.stop();
    }
    let mut want = raw_contents(&image);
    let export = MountedExport::start(&image, &mnt, mode, &["-w", "--format", "qcow2"]);
    let file = open_rw(export.path()).unwrap();
    for _ in 0..40 {
        let at = rng.below(want.len() as u64);
        let n = (1 + rng.below(200 * KIB)).min(want.len() as u64 - at) as usize;
        let data = pattern(rng.next_u64(), at, n);
        file.write_all_at(&data, at).unwrap();
        want[at as usize..at as usize + n].copy_from_slice(&data);
    }
    file.sync_all().unwrap();
    drop(file);
    export.stop();
    assert_check_clean(&image, "after writes beside snapshots");
    assert_bytes_eq(&raw_contents(&image), &want, "the active state");
    for (key, want) in ["1", "2"].iter().zip(&before) {
        assert_bytes_eq(&snapshot_contents(&image, key), want, key);
    }
    for (args, says) in [
        (
            &["--snapshot", "third"][..],
            "no snapshot with ID or name \"third\"",
        ),
        (&["-w", "--snapshot", "first"][..], "read-only"),
    ] {
        corofuse_tests::export::assert_setup_error(
            &sandbox,
            image.as_os_str(),
            &mnt,
            args,
            &[says],
        );
    }
}
