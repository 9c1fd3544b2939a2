//! `--direct` with aligned client I/O: every WRITE's data and every READ's reply reach the
//! O_DIRECT image from page-aligned memory, so nothing is bounced, copied or read back,
//! whatever the size from 4 KiB to 1 MiB; only a write that starts or ends inside a block
//! is a read-modify-write. Checked from the daemon's own `--stats` counters.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, open_rw, pattern, AlignedBuf, Dispatch,
    MountedExport, Sandbox, KIB, MIB,
};

const LEN: u64 = 8 * MIB;
const SIZES: [u64; 7] = [
    4 * KIB,
    8 * KIB,
    12 * KIB,
    64 * KIB,
    128 * KIB,
    512 * KIB,
    MIB,
];

dispatch_tests!(mount_direct_aligned_io_is_never_bounced);
fn mount_direct_aligned_io_is_never_bounced(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let mut expected = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &expected);
    let stats = sandbox.path("stats.json");
    let args = ["-w", "--direct", "--stats", stats.to_str().unwrap()];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    let file = open_direct(export.path(), true).unwrap();
    let mut offset = 0;
    for (i, size) in SIZES.into_iter().enumerate() {
        let data = AlignedBuf::from_slice(&pattern(10 + i as u64, offset, size as usize));
        file.write_all_at(&data, offset).unwrap();
        expected[offset as usize..][..size as usize].copy_from_slice(&data);
        let mut back = AlignedBuf::zeroed(size as usize);
        file.read_exact_at(&mut back, offset).unwrap();
        assert_bytes_eq(&back, &data, &format!("{size} bytes at {offset}"));
        offset += size + 4 * KIB;
    }
    // One write inside blocks, through a plain fd (the export's files are FOPEN_DIRECT_IO,
    // so it reaches the daemon as it is): the only read-modify-write.
    let odd = pattern(99, 100, 1000);
    open_rw(export.path())
        .unwrap()
        .write_all_at(&odd, 100)
        .unwrap();
    expected[100..1100].copy_from_slice(&odd);
    drop(file);
    export.stop();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
    let backend = backend_stats(&stats);
    let count = |name: &str| {
        backend[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no backend.{name} in {backend}"))
    };
    assert_eq!(
        (
            count("bounced_writes"),
            count("bounced_reads"),
            count("rmw_writes")
        ),
        (0, 0, 1),
        "{mode}: aligned transfers bounced: {backend}"
    );
    assert_eq!(
        count("range_waits"),
        0,
        "{mode}: one client, nothing to wait for"
    );
}

fn backend_stats(path: &Path) -> serde_json::Value {
    let json: serde_json::Value =
        serde_json::from_slice(&fs::read(path).expect("--stats written at exit")).unwrap();
    json["backend"].clone()
}
