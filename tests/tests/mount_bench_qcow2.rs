//! `corofuse bench --only qcow2,qcow2-alloc --compare-qsd` with tiny sizes (an 8 MiB
//! storage image, 0.2 s runs): the qcow2 rows run once with both servers, beside the
//! disk row and the device ceiling, print IOPS and their ratio to the raw export, keep
//! the converted image beside the raw one, remove the empty image of the allocating
//! row, and leave no mount behind. The speed is not checked.

use std::path::Path;
use std::process::Command;

use corofuse_tests::{require_fuse, require_tool};

/// The whitespace-separated fields of the first table line that starts with `export`
/// (then a space) and holds `workload` and `server`.
fn fields<'a>(table: &'a str, export: &str, workload: &str, server: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| {
            l.starts_with(&format!("{export} ")) && l.contains(workload) && l.contains(server)
        })
        .unwrap_or_else(|| panic!("no {export} {workload} {server} row in\n{table}"))
        .split_whitespace()
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn mount_bench_qcow2_rows_run_once_with_tiny_sizes() {
    require_fuse!();
    require_tool!("qemu-img", "qemu-storage-daemon");
    let storage = tempfile::Builder::new()
        .prefix("corofuse-bench-qcow2-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(corofuse_tests::bin::corofuse())
        .args(["bench", "--only", "qcow2,qcow2-alloc", "--compare-qsd"])
        .args(["--storage-mib", "8", "--seconds", "0.2"])
        .args(["--workload", "randread-psync-qd1"])
        .args(["--workload", "randwrite-uring-qd64"])
        .arg("--storage-dir")
        .arg(storage.path())
        .arg("--scratch-dir")
        .arg(scratch.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    // device 2 + disk 2x2 + qcow2 2x2 + qcow2-alloc 1x2 (no reads from an empty image).
    assert!(stderr.contains("[12/12]"), "{stderr}");
    assert!(
        stdout.contains("vs raw = IOPS / the disk row's"),
        "{stdout}"
    );

    // export, 4-word workload, server, IOPS, vs device, vs raw.
    for (export, workload) in [
        ("qcow2", "randread 4k psync qd1"),
        ("qcow2", "randwrite 4k io_uring qd64"),
        ("qcow2-alloc", "randwrite 4k io_uring qd64"),
    ] {
        for server in ["corofuse", "qsd"] {
            let f = fields(&stdout, export, workload, server);
            assert!(f[6].parse::<f64>().is_ok_and(|v| v > 0.0), "{f:?}");
            assert!(f[7].ends_with('x') && f[8].ends_with('x'), "{f:?}");
        }
    }
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with("qcow2-alloc ") && l.contains("randread")),
        "qcow2-alloc runs no reads:\n{stdout}"
    );
    assert_eq!(
        entries(storage.path()),
        [
            "corofuse-bench.qcow2",
            "corofuse-bench.raw",
            "corofuse-bench.raw.filled"
        ],
        "the converted image is kept, the empty one removed"
    );
    let info = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(storage.path().join("corofuse-bench.qcow2"))
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.contains("\"cluster-size\": 65536") && info.contains("\"virtual-size\": 8388608"),
        "{info}"
    );
    // The one warning expected: qsd compared with the built-in load only.
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("built-in load only"), "{stderr}");
    assert!(
        entries(scratch.path()).is_empty(),
        "the scratch directory is removed"
    );
}
