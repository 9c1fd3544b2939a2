//! `backend::open`: specs, and one-line errors that name what failed.

mod util;

use std::io::{self, ErrorKind};

use backend::{open, BlockBackend, OpenOptions};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: false,
    format: backend::Format::Auto,
    snapshot: None,
};

fn open_err(spec: &str, opts: &OpenOptions) -> io::Error {
    match open(spec, opts) {
        Ok(b) => panic!("{spec} opened as {}", b.describe()),
        Err(e) => e,
    }
}

#[test]
fn missing_image_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.img");
    for opts in [OpenOptions::default(), RW] {
        let e = open_err(path.to_str().unwrap(), &opts);
        let want = format!(
            "cannot open image {}: No such file or directory (os error 2)",
            path.display()
        );
        assert_eq!((e.kind(), e.to_string()), (ErrorKind::NotFound, want));
    }
}

#[test]
fn directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for opts in [OpenOptions::default(), RW] {
        let e = open_err(dir.path().to_str().unwrap(), &opts);
        let want = format!(
            "cannot open image {}: Is a directory (os error 21)",
            dir.path().display()
        );
        assert_eq!(e.to_string(), want);
    }
}

#[test]
fn character_device_is_refused() {
    let e = open_err("/dev/null", &OpenOptions::default());
    assert_eq!(
        e.to_string(),
        "cannot open image /dev/null: not a regular file or block device"
    );
}

#[test]
fn bad_specs() {
    let cases = [
        (
            "",
            "invalid image spec \"\": give a path, or null:SIZE (e.g. null:1G)",
        ),
        (
            "file:",
            "invalid image spec \"file:\": give a path, or null:SIZE (e.g. null:1G)",
        ),
        (
            "null",
            "invalid image spec \"null\": the null backend needs a size, e.g. null:1G",
        ),
        (
            "null:",
            "invalid image spec \"null:\": empty size (expected e.g. 4096, 512M or 1G)",
        ),
        (
            "null:1X",
            "invalid image spec \"null:1X\": invalid size \"1X\": unknown suffix \"X\" \
             (use K, M, G or T, optionally followed by iB or B)",
        ),
        (
            "null:big",
            "invalid image spec \"null:big\": invalid size \"big\": expected a number of bytes \
             with an optional K, M, G or T suffix (e.g. 512M)",
        ),
    ];
    for (spec, want) in cases {
        let e = open_err(spec, &RW);
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (ErrorKind::InvalidInput, want)
        );
    }
}

#[test]
fn file_specs_open_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("null:1G");
    std::fs::write(&path, [7u8; 1000]).unwrap();
    let b = open(&format!("file:{}", path.display()), &RW).unwrap();
    assert_eq!((b.len(), b.read_only()), (1000, false));
    assert_eq!(
        b.describe(),
        format!("file:{} (buffered) (format probed: raw)", path.display())
    );
    let raw = OpenOptions {
        format: backend::Format::Raw,
        ..RW
    };
    let b = open(&format!("file:{}", path.display()), &raw).unwrap();
    assert_eq!(b.describe(), format!("file:{} (buffered)", path.display()));
    let ro = open(path.to_str().unwrap(), &OpenOptions::default()).unwrap();
    assert!(ro.read_only());
}

#[test]
fn backends_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<dyn BlockBackend>();
    assert_send_sync::<backend::FileBackend>();
}
