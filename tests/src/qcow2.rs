//! qcow2 images made by qemu-img (and written by qemu-io), in the shapes the qcow2 tests
//! read back: v2 and v3, 512 B / 64 KiB / 2 MiB clusters, zlib and zstd compression,
//! backing files (raw and qcow2, shorter than the image). What each should read as is
//! what `qemu-img convert -O raw` gives ([`raw_contents`]).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::qemu::{describe, qemu};
use crate::{pattern, KIB, MIB};

/// Size of the source disk: 6 MiB and 3 sectors (the last cluster is partial).
pub const SOURCE_LEN: u64 = 6 * MIB + 1536;

/// Runs qemu-img with `args`; panics with its output if it fails.
#[track_caller]
pub fn qemu_img<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let out = qemu("qemu-img", args);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert!(
        out.status.success(),
        "qemu-img {shown:?}: {}",
        describe(&out)
    );
    out
}

/// Runs qemu-io on a qcow2 image with the commands `cmds` (each one `-c`).
#[track_caller]
pub fn qemu_io(image: &Path, cmds: &[&str]) {
    let mut args: Vec<String> = vec!["-f".into(), "qcow2".into()];
    for c in cmds {
        args.extend(["-c".into(), c.to_string()]);
    }
    args.push(image.display().to_string());
    let out = qemu("qemu-io", &args);
    assert!(out.status.success(), "qemu-io {args:?}: {}", describe(&out));
}

/// The disk `image` holds, as `qemu-img convert -O raw` writes it.
pub fn raw_contents(image: &Path) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let raw = dir.path().join("raw");
    qemu_img(&[
        OsStr::new("convert"),
        OsStr::new("-O"),
        OsStr::new("raw"),
        image.as_os_str(),
        raw.as_os_str(),
    ]);
    fs::read(&raw).expect("read the converted image")
}

/// The disk that internal snapshot `key` (ID or name) of `image` holds, as
/// `qemu-img convert -l KEY -O raw` writes it.
pub fn snapshot_contents(image: &Path, key: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let raw = dir.path().join("raw");
    let convert = |load: String| {
        let args = [
            OsStr::new("convert"),
            OsStr::new("-l"),
            OsStr::new(&load),
            OsStr::new("-O"),
            OsStr::new("raw"),
            image.as_os_str(),
            raw.as_os_str(),
        ];
        qemu("qemu-img", &args)
    };
    // qemu-img takes an ID or a name only when told which: try the ID first, as corofuse.
    if !convert(format!("snapshot.id={key}")).status.success() {
        let out = convert(format!("snapshot.name={key}"));
        assert!(
            out.status.success(),
            "qemu-img convert -l {key}: {}",
            describe(&out)
        );
    }
    fs::read(&raw).expect("read the converted snapshot")
}

/// `qemu-img snapshot -c NAME image`.
#[track_caller]
pub fn make_snapshot(image: &Path, name: &str) {
    qemu_img(&["snapshot", "-c", name, image.to_str().expect("UTF-8 path")]);
}

/// The shapes of [`with_snapshots`]: (name, `-o` options).
pub const SNAPSHOT_SHAPES: [(&str, &str); 3] = [
    ("v3 64k", "compat=1.1"),
    ("v3 512", "compat=1.1,cluster_size=512"),
    ("v2 4k", "compat=0.10,cluster_size=4k"),
];

/// An image with two internal snapshots made by `qemu-img snapshot`: "first" (ID 1) of a
/// 3 MiB disk with data, then writes over some of it, zeroes, a discard and a compressed
/// cluster, a resize to 4 MiB (v3; QEMU resizes no v2 image with snapshots), "second"
/// (ID 2), and more writes into the active state. Every kind of sharing: clusters and L2 tables in both snapshots, in one,
/// and in the active state alone.
pub fn with_snapshots(dir: &Path, name: &str, opts: &str) -> PathBuf {
    let path = dir.join(format!("{}.qcow2", name.replace(' ', "-")));
    create(&path, opts, Some("3M"));
    qemu_io(
        &path,
        &[
            "write -P 1 0 1M",
            "write -P 2 2M 512k",
            "write -P 7 1536k 8k",
        ],
    );
    make_snapshot(&path, "first");
    qemu_io(
        &path,
        &[
            "write -P 3 512k 1M",
            "write -z 2M 64k",
            "discard 2560k 64k",
            "write -c -P 5 2816k 64k",
        ],
    );
    // QEMU resizes no v2 image with snapshots (their entries cannot record the size).
    match opts.contains("compat=0.10") {
        true => qemu_io(&path, &["write -P 8 2M 64k"]),
        false => drop(qemu_img(&[
            "resize",
            path.to_str().expect("UTF-8 path"),
            "4M",
        ])),
    }
    make_snapshot(&path, "second");
    qemu_io(&path, &["write -P 4 0 100k", "write -P 6 2900k 100k"]);
    path
}

/// A raw disk of [`SOURCE_LEN`] with data, zeroes written out, and holes.
pub fn source(dir: &Path) -> PathBuf {
    let path = dir.join("source.raw");
    let file = fs::File::create(&path).expect("create the source");
    file.set_len(SOURCE_LEN).expect("size the source");
    for (offset, len) in [
        (0, 70 * KIB),
        (MIB - 512, 512 * KIB + 3 * 512),
        (3 * MIB + 4 * KIB, 8 * KIB),
        (4 * MIB, 2 * MIB),
        (SOURCE_LEN - 1024, 1024),
    ] {
        let data = pattern(offset ^ 0x51, offset, len as usize);
        file.write_all_at(&data, offset).expect("write the source");
    }
    file.write_all_at(&vec![0u8; 256 * KIB as usize], 2 * MIB)
        .expect("write zeroes");
    path
}

/// One image to read back.
pub struct Variant {
    /// What it is, for messages: "v3 64k zstd".
    pub name: String,
    /// The image file.
    pub path: PathBuf,
}

/// Converts `source` into a qcow2 image named `name` with `opts` (`-o`) and `extra` args.
fn convert(dir: &Path, source: &Path, name: &str, opts: &str, extra: &[&str]) -> Variant {
    let path = dir.join(format!("{}.qcow2", name.replace(' ', "-")));
    let mut args: Vec<&OsStr> = vec!["convert".as_ref(), "-f".as_ref(), "raw".as_ref()];
    args.extend(["-O", "qcow2", "-o", opts].map(OsStr::new));
    args.extend(extra.iter().map(OsStr::new));
    args.extend([source.as_os_str(), path.as_os_str()]);
    qemu_img(&args);
    Variant {
        name: name.into(),
        path,
    }
}

/// Every shape, converted from [`source`] or layered over it.
pub fn variants(dir: &Path) -> Vec<Variant> {
    let src = source(dir);
    let mut all = vec![
        convert(dir, &src, "v2 64k", "compat=0.10", &[]),
        convert(dir, &src, "v3 64k", "compat=1.1", &[]),
        convert(dir, &src, "v3 512", "compat=1.1,cluster_size=512", &[]),
        convert(dir, &src, "v2 2M", "compat=0.10,cluster_size=2M", &[]),
        convert(dir, &src, "v3 64k zlib", "compat=1.1", &["-c"]),
        convert(
            dir,
            &src,
            "v2 4k zlib",
            "compat=0.10,cluster_size=4k",
            &["-c"],
        ),
        convert(
            dir,
            &src,
            "v3 64k zstd",
            "compat=1.1,compression_type=zstd",
            &["-c"],
        ),
    ];
    all.push(overlay(dir, &src, "raw", "v3 over raw", "compat=1.1"));
    let base = convert(dir, &src, "base v3 4k", "compat=1.1,cluster_size=4k", &[]);
    all.push(overlay(
        dir,
        &base.path,
        "qcow2",
        "v2 over qcow2",
        "compat=0.10",
    ));
    all.push(base);
    all
}

/// An image over `backing` (8 MiB: longer than it), with writes, zeroes and discards of its
/// own made by qemu-io.
fn overlay(dir: &Path, backing: &Path, format: &str, name: &str, opts: &str) -> Variant {
    let path = dir.join(format!("{}.qcow2", name.replace(' ', "-")));
    let opts = format!(
        "{opts},backing_file={},backing_fmt={format}",
        backing.display()
    );
    qemu_img(&[
        OsStr::new("create"),
        OsStr::new("-f"),
        OsStr::new("qcow2"),
        OsStr::new("-o"),
        OsStr::new(&opts),
        path.as_os_str(),
        OsStr::new("8M"),
    ]);
    qemu_io(
        &path,
        &[
            "write -P 0x5a 100k 300k",
            "write -z 4M 64k",
            "write -P 0xa5 6M 1M",
            "discard 5M 128k",
        ],
    );
    Variant {
        name: name.into(),
        path,
    }
}

/// `qemu-img create -f qcow2 -o OPTS IMAGE [SIZE]` (no size: the backing file's).
#[track_caller]
pub fn create(image: &Path, opts: &str, size: Option<&str>) {
    let mut args = vec![
        "create",
        "-f",
        "qcow2",
        "-o",
        opts,
        image.to_str().expect("UTF-8 path"),
    ];
    args.extend(size);
    qemu_img(&args);
}

/// `qemu-img check` finds no errors and no leaked clusters in `image`.
#[track_caller]
pub fn assert_check_clean(image: &Path, what: &str) {
    let out = qemu(
        "qemu-img",
        &["check", "-f", "qcow2", image.to_str().expect("UTF-8 path")],
    );
    let text = describe(&out);
    assert!(
        out.status.success() && text.contains("No errors were found"),
        "{what}: qemu-img check: {text}"
    );
}

/// `qemu-img compare` finds the qcow2 `image` identical to the raw image `raw`.
#[track_caller]
pub fn assert_same_as_raw(image: &Path, raw: &Path, what: &str) {
    let (image, raw) = (image.to_str().expect("UTF-8"), raw.to_str().expect("UTF-8"));
    let out = qemu(
        "qemu-img",
        &["compare", "-f", "qcow2", "-F", "raw", image, raw],
    );
    assert!(
        out.status.success(),
        "{what}: qemu-img compare: {}",
        describe(&out)
    );
}

/// `qemu-img info` says the disk in `image` is `len` bytes.
#[track_caller]
pub fn assert_virtual_size(image: &Path, len: u64) {
    let out = qemu_img(&["info", "--output=json", image.to_str().expect("UTF-8 path")]);
    let info = String::from_utf8_lossy(&out.stdout);
    assert!(info.contains(&format!("\"virtual-size\": {len}")), "{info}");
}
