//! `corofuse bench --dir` with tiny sizes: the whole lab runs (source tree on a real file
//! system, a fresh `mount-dir` per row, fio), prints every row with figures and no
//! error, says why the passthrough_hp column is absent, and leaves nothing behind. The
//! speed is not checked.

use std::path::Path;
use std::process::Command;

use corofuse_tests::{require_fuse, require_tool};

const ROWS: [&str; 10] = [
    "create 40 files",
    "stat 40 files",
    "unlink 40 files",
    "ls -l 300 entries",
    "find 40 files",
    "randread 4k psync qd1",
    "randwrite 4k psync qd1",
    "randread 4k io_uring qd64",
    "randwrite 4k io_uring qd64",
    "randwrite 1m io_uring qd64 x16 jobs",
];

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn mount_bench_dir_prints_every_row_without_errors() {
    require_fuse!();
    require_tool!("fio");
    let storage = tempfile::Builder::new()
        .prefix("corofuse-bench-dir-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(corofuse_tests::bin::corofuse())
        .args(["bench", "--dir", "--files", "40", "--entries", "30,300"])
        .args(["--file-mib", "8", "--seconds", "0.2"])
        .arg("--storage-dir")
        .arg(storage.path())
        .arg("--scratch-dir")
        .arg(scratch.path())
        .env_remove("COROFUSE_PASSTHROUGH_HP")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains("passthrough_hp: ABSENT: no passthrough_hp binary given"),
        "{stdout}"
    );
    assert!(stdout.contains("corofuse mount-dir --timeout 86400 --cache always --writeback"));
    for row in ROWS {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} row in\n{stdout}"));
        assert!(line.contains("corofuse"), "{line}");
        // row, server, then the ops and ops/s columns hold numbers.
        let rest = line[row.len()..].split_whitespace().collect::<Vec<_>>();
        assert!(rest[1].parse::<f64>().is_ok_and(|n| n > 0.0), "{line}");
        assert!(rest[2].parse::<f64>().is_ok_and(|n| n > 0.0), "{line}");
    }
    for n in ["30", "300"] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(n))
            .unwrap_or_else(|| panic!("no readdir {n} row in\n{stdout}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        // entries, server, then client, whole request, handler and driver ns per entry.
        for c in &cols[2..6] {
            assert!(c.parse::<f64>().is_ok_and(|v| v > 0.0), "{line}");
        }
    }
    assert!(
        !stdout.contains("FAILED") && !stdout.contains("runs failed"),
        "{stdout}"
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(
        entries(storage.path()).is_empty(),
        "the source tree is removed"
    );
    assert!(
        entries(scratch.path()).is_empty(),
        "the scratch directory is removed"
    );
}
