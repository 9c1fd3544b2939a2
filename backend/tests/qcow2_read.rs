//! The qcow2 backend reads images made by qemu-img byte for byte as `qemu-img convert -O
//! raw` does, in every shape (see `corofuse_tests::qcow2::variants`), from threads and
//! from coroutines; and refuses at open, in one line, what it cannot serve.

mod util;

use std::io::IoSliceMut;
use std::path::Path;

use backend::{BlockBackend, Ctx, ExtentKind, Format, OpenOptions};
use corofuse_tests::qcow2::{
    qemu_img, qemu_io, raw_contents, snapshot_contents, variants, with_snapshots, Variant,
    SNAPSHOT_SHAPES,
};
use corofuse_tests::{assert_bytes_eq, require_tool, Rng};

fn open(path: &Path, opts: &OpenOptions) -> std::sync::Arc<dyn BlockBackend> {
    backend::open(path.to_str().unwrap(), opts).unwrap_or_else(|e| panic!("open {path:?}: {e}"))
}

/// Reads all of `disk` in pieces of varied sizes and offsets, through two iovecs each.
fn read_all(cx: &Ctx<'_>, disk: &dyn BlockBackend, rng: &mut Rng) -> Vec<u8> {
    let len = disk.len() as usize;
    let mut out = vec![0xEEu8; len];
    let mut pos = 0;
    while pos < len {
        let want = (1 + rng.below(300 * 1024) as usize).min(len - pos);
        let split = rng.below(want as u64 + 1) as usize;
        let (a, b) = out[pos..pos + want].split_at_mut(split);
        let mut bufs = [IoSliceMut::new(a), IoSliceMut::new(b)];
        let n = disk.readv(cx, &mut bufs, pos as u64).unwrap();
        assert_eq!(n, want, "read at {pos}");
        pos += want;
    }
    out
}

fn check_variant(v: &Variant, cx: &Ctx<'_>) {
    let want = raw_contents(&v.path);
    let qcow2 = OpenOptions {
        format: Format::Qcow2,
        ..OpenOptions::default()
    };
    let disk = open(&v.path, &qcow2);
    assert_eq!(disk.len(), want.len() as u64, "{}: size", v.name);
    assert!(disk.describe().starts_with("qcow2:"), "{}", disk.describe());
    if v.name.contains("512") {
        assert!(
            disk.describe().contains("512 B clusters"),
            "{}",
            disk.describe()
        );
    }
    let got = read_all(cx, &*disk, &mut Rng::new(want.len() as u64));
    assert_bytes_eq(&got, &want, &v.name);
    // Past the end: short, then nothing.
    let mut tail = [0u8; 4096];
    let n = disk
        .readv(cx, &mut [IoSliceMut::new(&mut tail)], disk.len() - 100)
        .unwrap();
    assert_eq!(n, 100, "{}", v.name);
    assert_eq!(
        disk.readv(cx, &mut [IoSliceMut::new(&mut tail)], disk.len())
            .unwrap(),
        0
    );
}

#[test]
fn qcow2_reads_every_shape_like_qemu_img() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let all = variants(dir.path());
    for v in &all {
        eprintln!("{}: blocking", v.name);
        check_variant(v, &Ctx::Blocking);
    }
    let paths: Vec<_> = all.into_iter().map(|v| (v.name, v.path)).collect();
    util::in_coroutine(move |cx| {
        for (name, path) in paths {
            eprintln!("{name}: coroutine");
            check_variant(&Variant { name, path }, cx);
        }
    });
}

#[test]
fn qcow2_block_status_sees_holes_and_data() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.qcow2");
    qemu_img(&["create", "-f", "qcow2", path.to_str().unwrap(), "4M"]);
    qemu_io(&path, &["write -P 1 1M 64k", "write -z 2M 64k"]);
    let disk = open(&path, &OpenOptions::default());
    let status = |at| disk.block_status(&Ctx::Blocking, at).unwrap();
    assert_eq!((status(0).kind, status(0).end), (ExtentKind::Hole, 1 << 20));
    assert_eq!(
        (status(1 << 20).kind, status(1 << 20).end),
        (ExtentKind::Data, (1 << 20) + 65536)
    );
    assert_eq!(status(2 << 20).kind, ExtentKind::Hole);
    assert_eq!(status((4 << 20) - 1).end, 4 << 20);
    assert!(disk.block_status(&Ctx::Blocking, 4 << 20).is_err());
}

#[test]
fn format_raw_exports_the_container_and_qcow2_refuses_raw() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.qcow2");
    qemu_img(&["create", "-f", "qcow2", path.to_str().unwrap(), "1M"]);
    let file_len = std::fs::metadata(&path).unwrap().len();
    let raw = OpenOptions {
        format: Format::Raw,
        ..OpenOptions::default()
    };
    let disk = open(&path, &raw);
    assert_eq!(
        (disk.len(), disk.describe().starts_with("file:")),
        (file_len, true)
    );
    let plain = dir.path().join("plain.img");
    std::fs::write(&plain, vec![0u8; 4096]).unwrap();
    let forced = OpenOptions {
        format: Format::Qcow2,
        ..OpenOptions::default()
    };
    let e = backend::open(plain.to_str().unwrap(), &forced)
        .err()
        .unwrap();
    assert!(e.to_string().contains("no qcow2 magic"), "{e}");
}

/// Header bytes to overwrite: (offset, bytes).
type Patch<'a> = &'a [(u64, &'a [u8])];

/// Patches header bytes of a fresh image and returns the error opening it.
fn open_error_after(patch: Patch, writable: bool) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.qcow2");
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "compat=1.1",
        path.to_str().unwrap(),
        "1M",
    ]);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for (at, bytes) in patch {
        std::os::unix::fs::FileExt::write_all_at(&file, bytes, *at).unwrap();
    }
    let opts = OpenOptions {
        writable,
        ..OpenOptions::default()
    };
    match backend::open(path.to_str().unwrap(), &opts) {
        Ok(d) => panic!("opened {}", d.describe()),
        Err(e) => {
            let line = e.to_string();
            assert!(!line.contains('\n') && line.contains("p.qcow2"), "{line}");
            line
        }
    }
}

#[test]
fn qcow2_refuses_what_it_cannot_serve_in_one_line() {
    require_tool!("qemu-img");
    let far = 0x7fff_ffff_ffff_ff00u64.to_be_bytes();
    let cases: [(Patch, bool, &str); 8] = [
        (&[(60, &[0, 0, 0, 1])], false, "snapshot table not aligned"),
        // Fields pointing past the end of the file, named as qemu-img names them.
        (
            &[(8, &far), (16, &[0, 0, 0, 13])],
            false,
            "Invalid backing file offset",
        ),
        (
            &[(40, &[0, 0, 0, 0, 0x7f, 0xff, 0, 0])],
            false,
            "Invalid L1 table offset",
        ),
        (&[(32, &[0, 0, 0, 1])], false, "encryption (AES)"),
        (&[(79, &[1 << 2])], false, "external data file"),
        (&[(79, &[1 << 5])], false, "incompatible feature bit 5"),
        (&[(79, &[2])], true, "marked corrupt"),
        (&[(23, &[22])], false, "cluster_bits 22"),
    ];
    for (patch, writable, want) in cases {
        let line = open_error_after(patch, writable);
        assert!(line.contains(want), "want {want:?} in: {line}");
    }
}

#[test]
fn a_damaged_l2_pointer_fails_its_reads_with_eio_and_the_rest_is_served() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.qcow2");
    // 64 KiB clusters: one L2 table maps 512 MiB, so write a cluster in each of two.
    qemu_img(&["create", "-f", "qcow2", path.to_str().unwrap(), "1G"]);
    qemu_io(&path, &["write -P 7 0 64k", "write -P 9 600M 64k"]);
    // L1 entry 0 now points at an L2 table far past the end of the file.
    let l1 = {
        let head = std::fs::read(&path).unwrap();
        u64::from_be_bytes(head[40..48].try_into().unwrap())
    };
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let entry = (1u64 << 63) | 0x7fff_0000;
    std::os::unix::fs::FileExt::write_all_at(&file, &entry.to_be_bytes(), l1).unwrap();
    let qcow2 = OpenOptions {
        format: Format::Qcow2,
        ..OpenOptions::default()
    };
    let disk = open(&path, &qcow2);
    let mut buf = vec![0u8; 4096];
    let cx = Ctx::Blocking;
    let e = disk
        .readv(&cx, &mut [IoSliceMut::new(&mut buf)], 0)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let n = disk
        .readv(&cx, &mut [IoSliceMut::new(&mut buf)], 600 << 20)
        .unwrap();
    assert_eq!((n, buf[0]), (4096, 9), "the other table is still served");
}

#[test]
fn qcow2_snapshots_read_as_qemu_img_converts_them() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    for (shape, opts) in SNAPSHOT_SHAPES {
        let image = with_snapshots(dir.path(), shape, opts);
        let active = open(&image, &OpenOptions::default());
        assert!(
            active.describe().contains("2 internal snapshots"),
            "{}",
            active.describe()
        );
        let mut rng = Rng::new(7);
        let cx = Ctx::Blocking;
        assert_bytes_eq(
            &read_all(&cx, &*active, &mut rng),
            &raw_contents(&image),
            shape,
        );
        drop(active);
        for key in ["first", "1", "second", "2"] {
            let opts = OpenOptions {
                snapshot: Some(key.into()),
                ..OpenOptions::default()
            };
            let snap = open(&image, &opts);
            let want = snapshot_contents(&image, key);
            assert_eq!(
                snap.len(),
                want.len() as u64,
                "{shape}: snapshot {key}: size"
            );
            assert!(snap.read_only());
            let got = read_all(&cx, &*snap, &mut rng);
            assert_bytes_eq(&got, &want, &format!("{shape}: snapshot {key}"));
        }
    }
}

#[test]
fn qcow2_snapshot_not_found_or_writable_is_refused_in_one_line() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let (shape, opts) = SNAPSHOT_SHAPES[0];
    let image = with_snapshots(dir.path(), shape, opts);
    let p = image.to_str().unwrap();
    let with = |key: &str, writable: bool| OpenOptions {
        snapshot: Some(key.into()),
        writable,
        ..OpenOptions::default()
    };
    let e = backend::open(p, &with("third", false)).err().unwrap();
    assert!(
        e.to_string()
            .contains("no snapshot with ID or name \"third\": it has 1 (first), 2 (second)"),
        "{e}"
    );
    let e = backend::open(p, &with("first", true)).err().unwrap();
    assert!(e.to_string().contains("read-only"), "{e}");
    let raw = dir.path().join("plain.raw");
    std::fs::write(&raw, [0u8; 4096]).unwrap();
    let e = backend::open(raw.to_str().unwrap(), &with("first", false))
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("not qcow2, so it has no snapshots"),
        "{e}"
    );
}
