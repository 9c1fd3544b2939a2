//! Writes through the qcow2 backend: random writes, write_zeroes and discards into every
//! image shape, mirrored into a raw image; afterwards `qemu-img check` finds nothing
//! (not even leaks) and `qemu-img compare` finds the two identical. Also concurrent writers
//! on the same clusters, and resize.

mod util;

use std::fs;
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use backend::{BlockBackend, Ctx, OpenOptions};
use corofuse_tests::qcow2::{
    self, assert_check_clean, assert_same_as_raw, qemu_img, raw_contents, variants,
};
use corofuse_tests::{pattern, require_tool, Rng, Seed};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: true,
    format: backend::Format::Qcow2,
    snapshot: None,
};

fn open_rw(path: &Path) -> Arc<dyn BlockBackend> {
    backend::open(path.to_str().unwrap(), &RW).unwrap_or_else(|e| panic!("open {path:?}: {e}"))
}

/// Applies `ops` random operations to `disk` and the same to the raw `mirror`.
fn random_ops(cx: &Ctx<'_>, disk: &dyn BlockBackend, mirror: &fs::File, rng: &mut Rng, ops: usize) {
    let len = disk.len();
    for i in 0..ops {
        let at = rng.below(len);
        let n = (1 + rng.below(200 * 1024)).min(len - at);
        match rng.below(10) {
            0 => {
                disk.write_zeroes(cx, at, n, rng.below(2) == 0).unwrap();
                mirror.write_all_at(&vec![0u8; n as usize], at).unwrap();
            }
            1 => {
                disk.discard(cx, at, n).unwrap();
                mirror.write_all_at(&vec![0u8; n as usize], at).unwrap();
            }
            2 => disk.flush(cx).unwrap(),
            _ => {
                let data = pattern(rng.next_u64(), at, n as usize);
                let (a, b) = data.split_at(rng.below(n + 1) as usize);
                disk.writev(cx, &[IoSlice::new(a), IoSlice::new(b)], at)
                    .unwrap_or_else(|e| panic!("op {i}: write {n} at {at}: {e}"));
                mirror.write_all_at(&data, at).unwrap();
            }
        }
    }
    // Read back through the backend too.
    let mut got = vec![0u8; len as usize];
    let n = disk.readv(cx, &mut [IoSliceMut::new(&mut got)], 0).unwrap();
    assert_eq!(n as u64, len);
    let mut want = vec![0u8; len as usize];
    mirror.read_exact_at(&mut want, 0).unwrap();
    corofuse_tests::assert_bytes_eq(&got, &want, "read back through the backend");
}

/// Writes into each shape named in `only` (all but the base image if empty).
fn writes_into_every_shape(cx: &Ctx<'_>, seed: u64, only: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    for v in variants(dir.path()) {
        if v.name.starts_with("base") || !(only.is_empty() || only.contains(&v.name.as_str())) {
            continue; // the backing file of "v2 over qcow2": must not change
        }
        eprintln!("{}", v.name);
        let mirror_path = dir.path().join("mirror.raw");
        fs::write(&mirror_path, raw_contents(&v.path)).unwrap();
        let mirror = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&mirror_path)
            .unwrap();
        let disk = open_rw(&v.path);
        random_ops(cx, &*disk, &mirror, &mut rng, 60);
        drop(disk);
        assert_check_clean(&v.path, &v.name);
        assert_same_as_raw(&v.path, &mirror_path, &v.name);
    }
}

#[test]
fn qcow2_random_writes_check_clean_and_compare_identical() {
    require_tool!("qemu-img", "qemu-io");
    let seed = Seed::choose();
    writes_into_every_shape(&Ctx::Blocking, seed.value(), &[]);
    let value = seed.value();
    let some = ["v3 512", "v3 64k zstd", "v3 over raw", "v2 over qcow2"];
    util::in_coroutine(move |cx| writes_into_every_shape(cx, value ^ 1, &some));
}

/// A fresh image from `qemu-img create` with `opts`, of `len` bytes.
fn create(dir: &Path, name: &str, opts: &str, len: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    qcow2::create(&path, opts, Some(len));
    path
}

#[test]
fn qcow2_fills_an_empty_image_across_refcount_blocks() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    // 512-byte clusters: a refcount block covers 128 KiB of file, an L2 table 32 KiB of disk.
    for (opts, name) in [
        ("compat=1.1,cluster_size=512", "small.qcow2"),
        ("compat=0.10", "v2.qcow2"),
    ] {
        let path = create(dir.path(), name, opts, "3M");
        let disk = open_rw(&path);
        let data = pattern(7, 0, 3 << 20);
        for (i, piece) in data.chunks(100_000).enumerate() {
            disk.writev(&Ctx::Blocking, &[IoSlice::new(piece)], i as u64 * 100_000)
                .unwrap();
        }
        drop(disk);
        assert_check_clean(&path, name);
        assert_eq!(raw_contents(&path), data, "{name}");
    }
}

/// Threads (and coroutines) write disjoint 4 KiB pieces of the same 64 KiB clusters of a
/// fresh image at once: every piece lands, none is lost to another's allocation.
#[test]
fn qcow2_concurrent_writers_to_the_same_clusters() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "c.qcow2", "compat=1.1", "4M");
    let disk = open_rw(&path);
    let writers = 16u64;
    let piece = |w: u64, c: u64| pattern(w * 1000 + c, 0, 4096);
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let disk = Arc::clone(&disk);
            std::thread::spawn(move || {
                for c in 0..32 {
                    let at = c * 65536 + w * 4096;
                    disk.writev(&Ctx::Blocking, &[IoSlice::new(&piece(w, c))], at)
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    // The same on the second half, from coroutines of one loop.
    let d = Arc::clone(&disk);
    util::in_coroutine(move |cx| {
        let Ctx::Coroutine(co) = cx else {
            unreachable!()
        };
        let joins: Vec<_> = (0..writers)
            .map(|w| {
                let d = Arc::clone(&d);
                co.spawn_joinable(move |co| {
                    for c in 32..64 {
                        let at = c * 65536 + w * 4096;
                        d.writev(&Ctx::Coroutine(co), &[IoSlice::new(&piece(w, c))], at)
                            .unwrap();
                    }
                })
                .unwrap()
            })
            .collect();
        joins.into_iter().for_each(|j| j.join(co).unwrap());
    });
    drop(disk);
    assert_check_clean(&path, "concurrent");
    let got = raw_contents(&path);
    for c in 0..64u64 {
        for w in 0..writers {
            let at = (c * 65536 + w * 4096) as usize;
            assert!(
                got[at..at + 4096] == piece(w, c)[..],
                "cluster {c}, writer {w}"
            );
        }
    }
}

#[test]
fn qcow2_resize_grows_the_l1_table_and_refuses_what_qemu_refuses() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "r.qcow2", "compat=1.1", "1M");
    let disk = open_rw(&path);
    let cx = Ctx::Blocking;
    let errno = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    assert_eq!(
        errno(disk.resize(&cx, 512 << 10)),
        Some(libc::EOPNOTSUPP),
        "shrink"
    );
    assert_eq!(
        errno(disk.resize(&cx, (1 << 20) + 100)),
        Some(libc::EINVAL),
        "unaligned"
    );
    assert_eq!(
        errno(disk.resize(&cx, 1 << 52)),
        Some(libc::EFBIG),
        "L1 past 32 MiB"
    );
    disk.writev(&cx, &[IoSlice::new(b"head")], 0).unwrap();
    // One L1 entry maps 512 MiB with 64 KiB clusters: first within it, then past it.
    disk.resize(&cx, 256 << 20).unwrap();
    disk.writev(&cx, &[IoSlice::new(b"mid")], (256 << 20) - 3)
        .unwrap();
    disk.resize(&cx, 3 << 30).unwrap();
    disk.writev(&cx, &[IoSlice::new(b"end")], (3 << 30) - 3)
        .unwrap();
    disk.writev(&cx, &[IoSlice::new(b"x")], 3 << 30).unwrap(); // grows by a sector
    assert_eq!(disk.len(), (3 << 30) + 512);
    drop(disk);
    assert_check_clean(&path, "resized");
    qcow2::assert_virtual_size(&path, (3 << 30) + 512);
    let disk = backend::open(path.to_str().unwrap(), &OpenOptions::default()).unwrap();
    for (at, want) in [
        (0, &b"head"[..]),
        ((256 << 20) - 3, b"mid"),
        ((3 << 30) - 3, b"end"),
    ] {
        let mut got = vec![0u8; want.len()];
        disk.readv(&cx, &mut [IoSliceMut::new(&mut got)], at)
            .unwrap();
        assert_eq!(got, want, "at {at}");
    }
}

#[test]
fn qcow2_read_only_refuses_writes() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "ro.qcow2", "compat=1.1", "1M");
    let disk = backend::open(path.to_str().unwrap(), &OpenOptions::default()).unwrap();
    let e = disk
        .writev(&Ctx::Blocking, &[IoSlice::new(b"x")], 0)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        disk.discard(&Ctx::Blocking, 0, 512)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );
}

/// A small write into a new cluster at the end of the file writes only its bytes: the
/// file was extended over the cluster, which reads as zeroes already.
#[test]
fn qcow2_small_writes_into_new_clusters_stay_small() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "big.qcow2", "compat=1.1,cluster_size=2M", "64M");
    let disk = open_rw(&path);
    let before = disk.allocated_bytes().unwrap();
    let mut want = vec![0u8; 64 << 20];
    for i in 0..8u64 {
        let at = i * (8 << 20) + 12345;
        let data = pattern(i, at, 4096);
        disk.writev(&Ctx::Blocking, &[IoSlice::new(&data)], at)
            .unwrap();
        want[at as usize..][..4096].copy_from_slice(&data);
    }
    let used = disk.allocated_bytes().unwrap() - before;
    assert!(
        used < 1 << 20,
        "8 writes of 4 KiB into 2 MiB clusters use {used} bytes"
    );
    drop(disk);
    assert_check_clean(&path, "small writes");
    assert!(raw_contents(&path) == want, "contents after small writes");
}

/// With O_DIRECT on the image file, metadata updates (8-byte entries) go through the file
/// backend's read-modify-write path; the image still checks clean and reads back right.
#[test]
fn qcow2_writes_with_o_direct() {
    require_tool!("qemu-img");
    let Ok(dir) = tempfile::tempdir_in("/var/tmp") else {
        return corofuse_tests::require::report_skip("no /var/tmp for an O_DIRECT image");
    };
    let path = create(dir.path(), "d.qcow2", "compat=1.1,cluster_size=4k", "4M");
    let opts = OpenOptions { direct: true, ..RW };
    let disk = match backend::open(path.to_str().unwrap(), &opts) {
        Ok(disk) => disk,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.to_string().contains("O_DIRECT") => {
            return corofuse_tests::require::report_skip(&format!("O_DIRECT refused: {e}"));
        }
        Err(e) => panic!("open with O_DIRECT: {e}"),
    };
    let mirror_path = dir.path().join("mirror.raw");
    fs::write(&mirror_path, vec![0u8; 4 << 20]).unwrap();
    let mirror = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&mirror_path)
        .unwrap();
    random_ops(&Ctx::Blocking, &*disk, &mirror, &mut Rng::new(5), 40);
    drop(disk);
    assert_check_clean(&path, "O_DIRECT");
    assert_same_as_raw(&path, &mirror_path, "O_DIRECT");
}

/// 512-byte clusters: a refcount table of one cluster covers 8 MiB of file, so 20 MiB of
/// data grows it (more than once); reopened, the image reads back and checks clean.
#[test]
fn qcow2_grows_a_full_refcount_table() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(
        dir.path(),
        "grow.qcow2",
        "compat=1.1,cluster_size=512",
        "24M",
    );
    let data = pattern(11, 0, 20 << 20);
    for round in 0..2 {
        let disk = open_rw(&path);
        let half = data.len() / 2;
        let part = &data[round * half..(round + 1) * half];
        for (i, piece) in part.chunks(1 << 20).enumerate() {
            let at = (round * half + (i << 20)) as u64;
            disk.writev(&Ctx::Blocking, &[IoSlice::new(piece)], at)
                .unwrap();
        }
        drop(disk);
        assert_check_clean(&path, &format!("round {round}"));
    }
    let out = qemu_img(&["info", "--output=json", path.to_str().unwrap()]);
    let got = raw_contents(&path);
    assert!(
        got[..data.len()] == data[..],
        "contents: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// 512-byte clusters: an L1 entry maps 32 KiB, so growing 1 MiB to 64 MiB needs a new L1
/// table of 32 clusters, contiguous, whose refcounts need new refcount blocks.
#[test]
fn qcow2_resize_moves_a_large_l1_table_in_small_clusters() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(
        dir.path(),
        "r512.qcow2",
        "compat=1.1,cluster_size=512",
        "1M",
    );
    let disk = open_rw(&path);
    let cx = Ctx::Blocking;
    let data = pattern(5, 0, 1 << 20);
    disk.writev(&cx, &[IoSlice::new(&data)], 0).unwrap();
    disk.resize(&cx, 64 << 20).unwrap();
    disk.writev(&cx, &[IoSlice::new(&data)], 63 << 20).unwrap();
    drop(disk);
    assert_check_clean(&path, "grown L1");
    let got = raw_contents(&path);
    assert_eq!(got.len(), 64 << 20);
    assert!(
        got[..1 << 20] == data[..] && got[63 << 20..] == data[..],
        "contents"
    );
}

/// A big-endian u64 of `bytes` at `at`.
fn be64(bytes: &[u8], at: u64) -> u64 {
    u64::from_be_bytes(bytes[at as usize..][..8].try_into().unwrap())
}

/// An L2 entry damaged to point into the header makes writes there fail with EIO (the
/// header is never overwritten); the rest of the image is served.
#[test]
fn qcow2_refuses_to_write_a_data_cluster_in_the_header() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "bad.qcow2", "compat=1.1", "1M");
    corofuse_tests::qcow2::qemu_io(&path, &["write -P 1 0 64k"]);
    let bytes = fs::read(&path).unwrap();
    let l2 = be64(&bytes, be64(&bytes, 40)) & 0x00ff_ffff_ffff_fe00;
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&(0x200u64 | 1 << 63).to_be_bytes(), l2)
        .unwrap();
    let disk = open_rw(&path);
    let e = disk
        .writev(&Ctx::Blocking, &[IoSlice::new(b"x")], 10)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    disk.writev(&Ctx::Blocking, &[IoSlice::new(b"y")], 65536)
        .unwrap();
    drop(disk);
    assert_eq!(&fs::read(&path).unwrap()[..4], b"QFI\xfb", "the header");
}

/// Opened for writing, an image's autoclear bits (here: bitmaps, which corofuse does not
/// update) are cleared, as the spec requires of a writer that does not know them.
#[test]
fn qcow2_clears_autoclear_bits_when_writable() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let path = create(dir.path(), "ac.qcow2", "compat=1.1", "1M");
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&1u64.to_be_bytes(), 88).unwrap();
    drop(backend::open(path.to_str().unwrap(), &OpenOptions::default()).unwrap());
    assert_eq!(
        be64(&fs::read(&path).unwrap(), 88),
        1,
        "read-only: left alone"
    );
    drop(open_rw(&path));
    assert_eq!(be64(&fs::read(&path).unwrap(), 88), 0, "writable: cleared");
}

/// Random writes, zeroes and discards into the active state of images whose snapshots
/// `qemu-img snapshot` made, in every shape: afterwards `qemu-img check` finds nothing
/// (no leaks), the active state compares identical to the mirror, and every snapshot reads
/// as it did before; deleting the snapshots with qemu-img leaves a clean image too.
fn writes_beside_snapshots(cx: &Ctx<'_>, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(seed);
    for (shape, opts) in qcow2::SNAPSHOT_SHAPES {
        let image = qcow2::with_snapshots(dir.path(), shape, opts);
        let before: Vec<Vec<u8>> = ["1", "2"]
            .iter()
            .map(|id| qcow2::snapshot_contents(&image, id))
            .collect();
        let mirror_path = dir.path().join("mirror.raw");
        fs::write(&mirror_path, raw_contents(&image)).unwrap();
        let mirror = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&mirror_path)
            .unwrap();
        let disk = open_rw(&image);
        random_ops(cx, &*disk, &mirror, &mut rng, 60);
        drop(disk);
        assert_check_clean(&image, shape);
        assert_same_as_raw(&image, &mirror_path, shape);
        for (id, want) in ["1", "2"].iter().zip(&before) {
            let got = qcow2::snapshot_contents(&image, id);
            corofuse_tests::assert_bytes_eq(&got, want, &format!("{shape}: snapshot {id}"));
        }
        let p = image.to_str().unwrap();
        qemu_img(&["snapshot", "-d", "first", p]);
        qemu_img(&["snapshot", "-d", "second", p]);
        assert_check_clean(&image, &format!("{shape}, snapshots deleted"));
        assert_same_as_raw(&image, &mirror_path, &format!("{shape}, snapshots deleted"));
    }
}

#[test]
fn qcow2_writes_beside_snapshots_leave_them_unchanged() {
    require_tool!("qemu-img", "qemu-io");
    let seed = Seed::choose();
    writes_beside_snapshots(&Ctx::Blocking, seed.value());
    let value = seed.value() ^ 1;
    util::in_coroutine(move |cx| writes_beside_snapshots(cx, value));
}

/// Every cluster of the active state is shared with a snapshot: a write of each, whole
/// or in part, copies first; the data the snapshot shared is written nowhere.
#[test]
fn qcow2_a_write_into_shared_clusters_copies_them_first() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let image = create(dir.path(), "s.qcow2", "compat=1.1,cluster_size=4k", "1M");
    qcow2::qemu_io(&image, &["write -P 9 0 1M"]);
    qcow2::make_snapshot(&image, "full");
    let disk = open_rw(&image);
    let cx = Ctx::Blocking;
    let mut want = vec![9u8; 1 << 20];
    for (at, len) in [
        (0u64, 4096usize),
        (6000, 100),
        (65536, 200_000),
        (1_040_000, 8576),
    ] {
        let data = pattern(at, at, len);
        disk.writev(&cx, &[IoSlice::new(&data)], at).unwrap();
        want[at as usize..at as usize + len].copy_from_slice(&data);
    }
    disk.flush(&cx).unwrap();
    drop(disk);
    assert_check_clean(&image, "after writes into shared clusters");
    assert_eq!(raw_contents(&image), want);
    assert_eq!(qcow2::snapshot_contents(&image, "full"), vec![9u8; 1 << 20]);
}

/// A discard that empties an L2 table of the image's own frees it: its L1 entry is zeroed,
/// its cluster punched after the flush (a hole in the file where it was; the 4 MiB - 4 KiB
/// of data go too, less what the host's extent tree takes to describe the new holes), and
/// `qemu-img check` finds no leak; a table left with one entry stays. 4 KiB clusters: a
/// table maps 2 MiB.
/// Whether byte `at` of the file at `path` lies in a hole (SEEK_DATA finds data after it).
fn is_hole(path: &Path, at: u64) -> bool {
    let file = fs::File::open(path).unwrap();
    corofuse_tests::sys::lseek(&file, at, libc::SEEK_DATA).map_or(true, |data| data > at)
}

#[test]
fn qcow2_frees_l2_tables_that_discards_emptied() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    for opts in ["compat=1.1,cluster_size=4k", "compat=0.10,cluster_size=4k"] {
        let path = create(dir.path(), "e.qcow2", opts, "8M");
        corofuse_tests::qcow2::qemu_io(&path, &["write -P 1 0 8M"]);
        let mut want = raw_contents(&path);
        let blocks = || fs::metadata(&path).unwrap().blocks() * 512;
        let before = blocks();
        let bytes = fs::read(&path).unwrap();
        let table = be64(&bytes, be64(&bytes, 40) + 8) & 0x00ff_ffff_ffff_fe00;
        let disk = open_rw(&path);
        let cx = Ctx::Blocking;
        disk.discard(&cx, 2 << 20, 2 << 20).unwrap(); // all of table 1
        disk.discard(&cx, (4 << 20) + 4096, (2 << 20) - 4096)
            .unwrap(); // table 2 but one
        disk.flush(&cx).unwrap();
        drop(disk);
        want[2 << 20..4 << 20].fill(0);
        want[(4 << 20) + 4096..6 << 20].fill(0);
        let bytes = fs::read(&path).unwrap();
        let l1 = be64(&bytes, 40);
        let entries = [0, 1, 2].map(|i| be64(&bytes, l1 + 8 * i));
        assert!(entries[0] != 0 && entries[2] != 0, "{opts}: {entries:x?}");
        assert_eq!(entries[1], 0, "{opts}: the emptied table is unlinked");
        assert_check_clean(&path, opts);
        corofuse_tests::assert_bytes_eq(&raw_contents(&path), &want, opts);
        assert!(
            is_hole(&path, table),
            "{opts}: the table's cluster at {table:#x}"
        );
        let freed = before - blocks();
        assert!(
            freed >= (4 << 20) - (64 << 10),
            "{opts}: the data clusters: {freed}"
        );
        fs::remove_file(&path).unwrap();
    }
}

/// A discard frees its clusters whatever the refcount width: with 1-bit refcounts, where a
/// refcount of 1 is also the largest, they leaked.
#[test]
fn qcow2_discard_frees_with_every_refcount_width() {
    require_tool!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    for bits in [1, 2, 4, 8, 16, 32, 64] {
        let opts = format!("compat=1.1,refcount_bits={bits}");
        let path = create(dir.path(), &format!("r{bits}.qcow2"), &opts, "8M");
        qcow2::qemu_io(&path, &["write -P 1 0 4M"]);
        let disk = open_rw(&path);
        disk.discard(&Ctx::Blocking, 0, 1 << 20).unwrap();
        disk.flush(&Ctx::Blocking).unwrap();
        drop(disk);
        assert_check_clean(&path, &opts);
    }
}
