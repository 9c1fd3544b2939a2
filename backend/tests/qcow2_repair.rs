//! Dirty images opened for writing are repaired first, as QEMU repairs them: images left
//! dirty by a killed QEMU (lazy refcounts), with and without internal snapshots, images
//! with leaked clusters (corofuse's own, after a kill), an image whose refcount structure
//! must be rebuilt; each then reads as `qemu-img check -r all` and `convert` make of a
//! copy, and `qemu-img check` finds it clean after a close, the DIRTY bit cleared. A
//! corrupt image is refused with the reason, unchanged.

use std::fs;
use std::io::IoSliceMut;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend::{BlockBackend, Ctx, OpenOptions};
use corofuse_tests::qcow2::{
    assert_check_clean, create, qemu_img, qemu_io, raw_contents, snapshot_contents, with_snapshots,
    SNAPSHOT_SHAPES,
};
use corofuse_tests::qemu::{describe, qemu};
use corofuse_tests::{assert_bytes_eq, pattern, require_tool};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: false, // a "killed" backend (forgotten) keeps its fd
    format: backend::Format::Qcow2,
    snapshot: None,
};

fn open(path: &Path, opts: &OpenOptions) -> Arc<dyn BlockBackend> {
    backend::open(path.to_str().unwrap(), opts).unwrap_or_else(|e| panic!("open {path:?}: {e}"))
}

fn read_all(disk: &dyn BlockBackend) -> Vec<u8> {
    let mut got = vec![0u8; disk.len() as usize];
    let n = disk
        .readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut got)], 0)
        .unwrap();
    assert_eq!(n, got.len());
    got
}

/// Whether `qemu-img info` finds the DIRTY bit set.
fn dirty(image: &Path) -> bool {
    let out = qemu_img(&["info", "-U", "--output=json", image.to_str().unwrap()]);
    let info = String::from_utf8_lossy(&out.stdout);
    // The image's own flag is the last (its children's come first).
    let at = info.rfind("\"dirty-flag\"").expect("a dirty-flag");
    info[at..].starts_with("\"dirty-flag\": true")
}

/// Runs qemu-io `cmds` on `image`, then kills it (SIGKILL from qemu-io itself), so that
/// its lazy refcounts are never written back.
fn qemu_io_killed(image: &Path, cmds: &[&str]) {
    let mut args: Vec<String> = vec!["-f".into(), "qcow2".into()];
    for c in cmds.iter().chain(&["sigraise 9"]) {
        args.extend(["-c".into(), c.to_string()]);
    }
    args.push(image.display().to_string());
    let out = qemu("qemu-io", &args);
    assert_eq!(
        out.status.code(),
        None,
        "qemu-io not killed: {}",
        describe(&out)
    );
    assert!(dirty(image), "the killed qemu-io left {image:?} clean");
}

/// What `qemu-img check -r all` and `convert` make of a copy of `image`.
fn repaired_by_qemu(image: &Path) -> Vec<u8> {
    let copy = image.with_extension("copy");
    fs::copy(image, &copy).unwrap();
    let out = qemu("qemu-img", &["check", "-r", "all", copy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "qemu-img check -r all: {}",
        describe(&out)
    );
    let disk = raw_contents(&copy);
    fs::remove_file(&copy).unwrap();
    disk
}

/// Opens the dirty `image` for writing: it reads as QEMU's repair of a copy does, takes a
/// write, and after the close is clean, with the DIRTY bit cleared.
fn repair_and_compare(image: &Path, what: &str) {
    let mut want = repaired_by_qemu(image);
    let disk = open(image, &RW);
    assert_bytes_eq(&read_all(&*disk), &want, &format!("{what}: repaired"));
    let data = pattern(7, 4096, 100_000);
    disk.writev(&Ctx::Blocking, &[std::io::IoSlice::new(&data)], 4096)
        .unwrap();
    want[4096..][..data.len()].copy_from_slice(&data);
    disk.flush(&Ctx::Blocking).unwrap();
    drop(disk);
    assert!(!dirty(image), "{what}: still dirty after a clean close");
    assert_check_clean(image, what);
    assert_bytes_eq(
        &raw_contents(image),
        &want,
        &format!("{what}: after a write"),
    );
}

#[test]
fn qcow2_repairs_an_image_a_killed_qemu_left_dirty() {
    require_tool!("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    // 512-byte clusters: one refcount block covers 128 KiB, so refcounts in many blocks.
    for (shape, opts) in [
        ("64k", "compat=1.1"),
        ("512", "compat=1.1,cluster_size=512"),
    ] {
        let image = dir.path().join(format!("{shape}.qcow2"));
        create(&image, &format!("{opts},lazy_refcounts=on"), Some("4M"));
        qemu_io(&image, &["write -P 1 0 1M"]);
        qemu_io_killed(
            &image,
            &[
                "write -P 2 512k 1M",
                "write -z 256k 64k",
                "discard 2M 64k",
                "write -c -P 3 3M 64k",
                "write -P 4 3600k 200k",
            ],
        );
        repair_and_compare(&image, shape);
    }
}

#[test]
fn qcow2_repair_counts_snapshots_shares() {
    require_tool!("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    for (shape, opts) in SNAPSHOT_SHAPES {
        if opts.contains("compat=0.10") {
            continue; // v2: no DIRTY bit, no lazy refcounts
        }
        let image = with_snapshots(dir.path(), shape, opts);
        qemu_img(&["amend", "-o", "lazy_refcounts=on", image.to_str().unwrap()]);
        let snapshots = ["1", "2"].map(|id| snapshot_contents(&image, id));
        qemu_io_killed(&image, &["write -P 9 64k 1M", "discard 2900k 64k"]);
        repair_and_compare(&image, shape);
        for (id, want) in ["1", "2"].iter().zip(&snapshots) {
            let got = snapshot_contents(&image, id);
            assert_bytes_eq(&got, want, &format!("{shape}: snapshot {id}"));
        }
    }
}

fn be64(image: &Path, at: u64) -> u64 {
    let mut b = [0u8; 8];
    fs::File::open(image)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    u64::from_be_bytes(b)
}

fn poke(image: &Path, at: u64, value: u64) {
    let f = fs::OpenOptions::new().write(true).open(image).unwrap();
    f.write_all_at(&value.to_be_bytes(), at).unwrap();
}

/// Sets the DIRTY bit of the v3 `image`.
fn make_dirty(image: &Path) {
    poke(image, 72, be64(image, 72) | 1);
}

/// A v3 image of 4 MiB, 64 KiB clusters, with 2 MiB of data from 0.
fn image_with_data(dir: &Path, name: &str) -> PathBuf {
    let image = dir.join(name);
    create(&image, "compat=1.1", Some("4M"));
    qemu_io(&image, &["write -P 1 0 2M"]);
    image
}

/// `qemu-img check` of `image`: its exit status and output.
fn check(image: &Path) -> (Option<i32>, String) {
    let out = qemu("qemu-img", &["check", image.to_str().unwrap()]);
    (out.status.code(), describe(&out))
}

#[test]
fn qcow2_reclaims_leaked_clusters() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    // Leaks with data: the L1 entry unlinked by hand, so its L2 table and the 2 MiB it
    // maps are referenced by nothing.
    let image = image_with_data(dir.path(), "unlinked.qcow2");
    let l1 = be64(&image, 40);
    poke(&image, l1, 0);
    make_dirty(&image);
    let before = fs::metadata(&image).unwrap().blocks() * 512;
    let (code, text) = check(&image);
    assert!(
        code == Some(3) && text.contains("leaked clusters"),
        "{text}"
    );
    let disk = open(&image, &RW);
    assert_eq!(read_all(&*disk), vec![0u8; 4 << 20]);
    drop(disk);
    assert_check_clean(&image, "unlinked");
    let after = fs::metadata(&image).unwrap().blocks() * 512;
    assert!(
        after + (2 << 20) <= before,
        "allocated {before} -> {after} bytes"
    );

    // corofuse's own: a backend "killed" (never dropped) after allocating writes leaks
    // its reservation, and leaves the image dirty.
    let image = dir.path().join("killed.qcow2");
    create(&image, "compat=1.1", Some("64M"));
    let disk = open(&image, &RW);
    let data = pattern(5, 0, 3 << 20);
    disk.writev(&Ctx::Blocking, &[std::io::IoSlice::new(&data)], 0)
        .unwrap();
    disk.flush(&Ctx::Blocking).unwrap();
    std::mem::forget(disk);
    assert!(dirty(&image), "a killed writer leaves the image dirty");
    let (code, text) = check(&image);
    assert!(code == Some(3) && !text.contains("ERROR"), "{text}");
    let disk = open(&image, &RW);
    assert_bytes_eq(&read_all(&*disk)[..data.len()], &data, "killed: data");
    drop(disk);
    assert_check_clean(&image, "killed");
}

#[test]
fn qcow2_rebuilds_an_unusable_refcount_structure() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let image = image_with_data(dir.path(), "rebuild.qcow2");
    let want = raw_contents(&image);
    // The first refcount block "lies" far past the end of the file.
    poke(&image, be64(&image, 48), 1 << 40);
    make_dirty(&image);
    let disk = open(&image, &RW);
    assert_bytes_eq(&read_all(&*disk), &want, "rebuilt");
    drop(disk);
    assert_check_clean(&image, "rebuilt");
    assert_ne!(be64(&image, 48), 0x10000, "a new refcount table");
}

/// What is damaged, how, and the reason the open gives.
type Damage = (&'static str, fn(&Path), &'static str);

#[test]
fn qcow2_refuses_a_corrupt_image_unchanged() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let cases: [Damage; 4] = [
        (
            "L2 entry past the end",
            |p| {
                let l2 = be64(p, be64(p, 40)) & 0x00ff_ffff_ffff_fe00;
                poke(p, l2 + 8, (1 << 63) | (1 << 40));
            },
            "past the end of the file",
        ),
        (
            "L1 entry to the refcount table",
            |p| poke(p, be64(p, 40), (1 << 63) | be64(p, 48)),
            "is both an L2 table and metadata",
        ),
        (
            "L2 entry to its own table",
            |p| {
                let l2 = be64(p, be64(p, 40)) & 0x00ff_ffff_ffff_fe00;
                poke(p, l2 + 8, (1 << 63) | l2);
            },
            "is both an L2 table and data",
        ),
        (
            "L2 entry not aligned",
            |p| {
                let l2 = be64(p, be64(p, 40)) & 0x00ff_ffff_ffff_fe00;
                poke(
                    p,
                    l2,
                    (1 << 63) | ((be64(p, l2) & 0x00ff_ffff_ffff_fe00) + 512),
                );
            },
            "not aligned to a cluster",
        ),
    ];
    for (what, damage, reason) in cases {
        let image = image_with_data(dir.path(), "corrupt.qcow2");
        damage(&image);
        make_dirty(&image);
        let bytes = fs::read(&image).unwrap();
        let line = match backend::open(image.to_str().unwrap(), &RW) {
            Ok(d) => panic!("{what}: opened {}", d.describe()),
            Err(e) => e.to_string(),
        };
        assert!(
            line.contains(reason) && line.contains("corrupt") && !line.contains('\n'),
            "{what}: {line}"
        );
        assert!(
            fs::read(&image).unwrap() == bytes,
            "{what}: the image changed"
        );
        // Read-only, a dirty image is served as it is.
        let ro = OpenOptions {
            writable: false,
            ..RW
        };
        open(&image, &ro);
        fs::remove_file(&image).unwrap();
    }
}

#[test]
fn qcow2_is_dirty_while_open_for_writing_v3_only() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let image = image_with_data(dir.path(), "v3.qcow2");
    let disk = open(&image, &RW);
    assert!(dirty(&image), "v3, open for writing");
    drop(disk);
    assert!(!dirty(&image), "v3, closed");
    let ro = OpenOptions {
        writable: false,
        ..RW
    };
    let disk = open(&image, &ro);
    assert!(!dirty(&image), "v3, read-only");
    drop(disk);
    let v2 = dir.path().join("v2.qcow2");
    create(&v2, "compat=0.10", Some("1M"));
    let disk = open(&v2, &RW);
    drop(disk);
    assert_eq!(be64(&v2, 4) >> 32, 2);
    assert_check_clean(&v2, "v2");
}

/// A refcount table that is usable but does not cover every referenced cluster (its entry
/// for the first block unlinked): the structure is rebuilt, and the old table, referenced
/// by nothing afterwards, is not left counted as a leak.
#[test]
fn qcow2_rebuild_leaves_no_leak_of_the_old_table() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let image = image_with_data(dir.path(), "uncovered.qcow2");
    let want = raw_contents(&image);
    poke(&image, be64(&image, 48), 0);
    make_dirty(&image);
    let disk = open(&image, &RW);
    assert_bytes_eq(&read_all(&*disk), &want, "rebuilt");
    drop(disk);
    assert_check_clean(&image, "rebuilt from an uncovering table");
}

/// How a test damages an image.
type Damaging = fn(&Path);

/// Dirty images with hostile table fields are refused with an error, opened for writing:
/// never a panic (a table whose end would pass 2^64) or an abort (a refcount table of
/// 2^32 - 1 clusters: QEMU refuses one past 8 MiB).
#[test]
fn qcow2_refuses_hostile_dirty_images_without_panicking() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    // L1 tables of 8192 entries (64 KiB) from the last cluster of the address space on.
    let cases: [(&str, Damaging); 3] = [
        ("active L1 table at the end of the address space", |p| {
            poke(p, 32, 0x2000); // crypt_method 0, l1_size 8192
            poke(p, 40, 0xffff_ffff_ffff_0000);
        }),
        ("refcount table of 2^32 - 1 clusters", |p| {
            poke(p, 56, (be64(p, 56) & 0xffff_ffff) | (0xffff_ffff << 32))
        }),
        ("snapshot L1 table at the end of the address space", |p| {
            let entry = be64(p, 64);
            poke(p, entry, 0xffff_ffff_ffff_0000);
            poke(
                p,
                entry + 8,
                (0x2000 << 32) | (be64(p, entry + 8) & 0xffff_ffff),
            );
        }),
    ];
    for (i, (what, damage)) in cases.into_iter().enumerate() {
        let image = image_with_data(dir.path(), "hostile.qcow2");
        if i == 2 {
            qemu_img(&["snapshot", "-c", "s", image.to_str().unwrap()]);
        }
        damage(&image);
        make_dirty(&image);
        if let Ok(d) = backend::open(image.to_str().unwrap(), &RW) {
            panic!("{what}: opened {}", d.describe());
        }
        fs::remove_file(&image).unwrap();
    }
}

/// A corrupt dirty image with a persistent bitmap (the autoclear bit that says its bitmaps
/// are consistent) is refused unchanged: the bit is kept, so QEMU keeps the bitmap.
#[test]
fn qcow2_refuses_a_corrupt_image_with_bitmaps_unchanged() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let image = image_with_data(dir.path(), "bitmap.qcow2");
    qemu_img(&["bitmap", "--add", image.to_str().unwrap(), "b0"]);
    assert_eq!(be64(&image, 88), 1, "the bitmaps autoclear bit");
    let l2 = be64(&image, be64(&image, 40)) & 0x00ff_ffff_ffff_fe00;
    poke(&image, l2 + 8, (1 << 63) | (1 << 40));
    make_dirty(&image);
    let bytes = fs::read(&image).unwrap();
    if let Ok(d) = backend::open(image.to_str().unwrap(), &RW) {
        panic!("opened {}", d.describe());
    }
    assert_eq!(be64(&image, 88), 1, "the autoclear bits were cleared");
    assert!(fs::read(&image).unwrap() == bytes, "the image changed");

    // Not corrupt: repaired, the bit cleared first (the bitmap's clusters leaks then).
    let image = image_with_data(dir.path(), "bitmap-ok.qcow2");
    qemu_img(&["bitmap", "--add", image.to_str().unwrap(), "b0"]);
    make_dirty(&image);
    drop(open(&image, &RW));
    assert_eq!(be64(&image, 88), 0);
    assert_check_clean(&image, "a dirty image with a bitmap");
}

/// A dirty image file that a hole makes 8 TiB long (512-byte clusters: 2^34 of them) is
/// refused or repaired, never an abort on allocation.
#[test]
fn qcow2_repairs_a_huge_sparse_dirty_image_without_aborting() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("sparse.qcow2");
    create(&image, "compat=1.1,cluster_size=512", Some("1M"));
    fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(8 << 40)
        .unwrap();
    make_dirty(&image);
    let _ = backend::open(image.to_str().unwrap(), &RW);
}
