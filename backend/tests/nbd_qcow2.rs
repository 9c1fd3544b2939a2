//! The qcow2 layer over the NBD backend (`--format qcow2` on an NBD URI): a qcow2 file
//! served as plain bytes (qemu-nbd -f raw) reads as QEMU reads it, takes writes inside the
//! export's size, and refuses to grow it, as QEMU's qcow2 over `driver=nbd` does.

mod util;

use std::fs;
use std::io::{IoSlice, IoSliceMut};
use std::path::Path;

use backend::{BlockBackend, Ctx, Format, NbdOptions, OpenOptions};
use corofuse_tests::nbd::{NbdServer, Via};
use corofuse_tests::qcow2::{assert_check_clean, assert_same_as_raw};
use corofuse_tests::qemu::qemu;
use corofuse_tests::require_tool;
use util::{errno, in_coroutine, pattern};

const MIB: usize = 1 << 20;

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn qemu_img(args: &[&str]) {
    let out = qemu("qemu-img", args);
    assert!(out.status.success(), "qemu-img {args:?}: {out:?}");
}

fn open(uri: &str, writable: bool) -> std::sync::Arc<dyn BlockBackend> {
    let opts = OpenOptions {
        writable,
        format: Format::Qcow2,
        ..OpenOptions::default()
    };
    backend::nbd::open_image(uri, &opts, &NbdOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// Data, a hole and unallocated clusters read as `qemu-img convert -O raw` gives them, in
/// both contexts; the size is the disk's, not the file's.
#[test]
fn nbd_qcow2_reads_as_qemu_img() {
    require_tool!("qemu-nbd", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let (raw, qcow2, expected) = (
        dir.path().join("src.raw"),
        dir.path().join("disk.qcow2"),
        dir.path().join("expected.raw"),
    );
    let mut disk = pattern(6 * MIB, 3);
    disk[2 * MIB..3 * MIB].fill(0);
    fs::write(&raw, &disk).unwrap();
    qemu_img(&["convert", "-O", "qcow2", path(&raw), path(&qcow2)]);
    qemu_img(&["resize", path(&qcow2), "8M"]); // 2 MiB never allocated
    qemu_img(&["convert", "-O", "raw", path(&qcow2), path(&expected)]);
    let want = fs::read(&expected).unwrap();
    let server = NbdServer::qemu_nbd(&qcow2, "raw", "", Via::Unix, &[]);
    let b = open(server.uri(), false);
    assert_eq!(b.len(), 8 * MIB as u64);
    let check = move |cx: &Ctx<'_>| {
        let mut all = vec![0u8; 8 * MIB];
        let n = b.readv(cx, &mut [IoSliceMut::new(&mut all)], 0).unwrap();
        assert_eq!(n, 8 * MIB);
        assert!(all == want, "differs from qemu-img convert -O raw");
    };
    check(&Ctx::Blocking);
    in_coroutine(check);
}

/// Writes to a preallocated image (every cluster inside the file) land where QEMU finds
/// them (qemu-img compare, check clean); on an image with no room left inside the export,
/// an allocating write fails with ENOSPC: the export cannot grow.
#[test]
fn nbd_qcow2_writes_inside_the_export_only() {
    require_tool!("qemu-nbd", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let (qcow2, model_file) = (dir.path().join("disk.qcow2"), dir.path().join("model.raw"));
    qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "preallocation=metadata",
        path(&qcow2),
        "4M",
    ]);
    let server = NbdServer::qemu_nbd(&qcow2, "raw", "", Via::Unix, &[]);
    let b = open(server.uri(), true);
    let mut model = vec![0u8; 4 * MIB];
    for (i, (at, len)) in [(0, 4096), (65536 + 512, 100_000), (3 * MIB, MIB)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8 + 1);
        b.writev(&Ctx::Blocking, &[IoSlice::new(&data)], at as u64)
            .unwrap();
        model[at..at + len].copy_from_slice(&data);
    }
    in_coroutine({
        let b = std::sync::Arc::clone(&b);
        move |cx| {
            let data = pattern(8192, 9);
            b.writev(cx, &[IoSlice::new(&data)], 2 * MIB as u64)
                .unwrap();
            b.flush(cx).unwrap();
        }
    });
    model[2 * MIB..2 * MIB + 8192].copy_from_slice(&pattern(8192, 9));
    b.flush(&Ctx::Blocking).unwrap();
    drop(b);
    drop(server);
    fs::write(&model_file, &model).unwrap();
    assert_same_as_raw(&qcow2, &model_file, "written over NBD");
    assert_check_clean(&qcow2, "written over NBD");

    // A fresh image: its file ends after the metadata, and the export with it.
    let fresh = dir.path().join("fresh.qcow2");
    qemu_img(&["create", "-f", "qcow2", path(&fresh), "64M"]);
    let server = NbdServer::qemu_nbd(&fresh, "raw", "", Via::Unix, &[]);
    let b = open(server.uri(), true);
    let e = b
        .writev(&Ctx::Blocking, &[IoSlice::new(&pattern(4096, 1))], 0)
        .unwrap_err();
    assert_eq!(errno(&e), libc::ENOSPC, "{e}");
    drop(b);
    drop(server);
    let out = qemu("qemu-img", &["check", path(&fresh)]);
    assert!(
        out.status.success(),
        "a refused allocation leaves the image clean: {out:?}"
    );
}
