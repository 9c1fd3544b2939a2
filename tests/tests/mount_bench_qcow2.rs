//! `corofuse bench --only qcow2,qcow2-alloc --compare-qsd` with tiny sizes (an 8 MiB
//! storage image, 0.2 s runs): the qcow2 rows run once with both servers, beside the
//! disk row and the device ceiling, print IOPS and their ratio to the raw export, keep
//! the converted image beside the raw one, remove the empty image of the allocating
//! row, and leave no mount behind. The speed is not checked.

use std::path::Path;
use std::process::Command;

use corofuse_tests::lab_run::TinyBench;
use corofuse_tests::{require_fuse, require_tool};

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
    let run = TinyBench::run("qcow2,qcow2-alloc");
    let (stdout, stderr) = (&run.stdout, &run.stderr);
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
            let f = run.fields(export, workload, server);
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
        entries(run.storage.path()),
        [
            "corofuse-bench.qcow2",
            "corofuse-bench.raw",
            "corofuse-bench.raw.filled"
        ],
        "the converted image is kept, the empty one removed"
    );
    let info = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(run.storage.path().join("corofuse-bench.qcow2"))
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
        entries(run.scratch.path()).is_empty(),
        "the scratch directory is removed"
    );
}
