//! `corofuse-lab bench` end to end: a one-second lab run on the null export, served by the
//! `corofuse` binary it is given, must print a table with a positive IOPS figure and leave
//! no mount, daemon or scratch directory.
//!
//! Needs root and /dev/fuse; elsewhere it says why it skips (a failure under
//! `COROFUSE_TEST_NO_SKIP=1`, as in `.ci/run`), with the mount tests' helpers.

use std::process::Command;

use corofuse_tests::require::{fuse_unavailable, report_skip};

/// The value under `column` in the first table row that starts with `export`.
fn cell<'a>(table: &'a str, export: &str, column: &str) -> Option<&'a str> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("export "));
    let header = lines.next()?;
    // Columns are separated by two or more spaces; the workload label has single spaces.
    let split = |l: &'a str| -> Vec<&'a str> {
        l.split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect()
    };
    let index = split(header).iter().position(|h| *h == column)?;
    let row = lines.find(|l| l.starts_with(export))?;
    split(row).get(index).copied()
}

#[test]
fn bench_null_randread_leaves_nothing_behind() {
    if let Some(why) = fuse_unavailable() {
        return report_skip(&why);
    }
    let child = Command::new(env!("CARGO_BIN_EXE_corofuse-lab"))
        .args(["bench", "--seconds", "1", "--only", "null"])
        .arg("--corofuse")
        .arg(corofuse_tests::bin::corofuse())
        .args(["--workload", "randread-psync-qd1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start corofuse-lab bench");
    let pid = child.id();
    let out = child
        .wait_with_output()
        .expect("wait for corofuse-lab bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}\n{stderr}",
        out.status
    );

    let iops: f64 = cell(&stdout, "null", "IOPS")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric IOPS in:\n{stdout}"));
    assert!(iops > 0.0, "IOPS {iops}\n{stdout}");
    assert!(
        stderr.contains("[1/1] null randread 4k psync qd1"),
        "{stderr}"
    );

    let scratch = format!("/dev/shm/corofuse-bench-{pid}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&scratch), "a mount was left:\n{mounts}");
    assert!(
        !std::path::Path::new(&scratch).exists(),
        "{scratch} was left"
    );
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(&scratch), "a process was left: {cmdline}");
    }
}

#[test]
fn table_cells_are_found_by_column() {
    let table = "header line\n\n\
                 export  workload                IOPS   MB/s\n\
                 null    randread 4k psync qd1  60076  246.1\n";
    assert_eq!(cell(table, "null", "IOPS"), Some("60076"));
    assert_eq!(cell(table, "null", "MB/s"), Some("246.1"));
    assert_eq!(cell(table, "file", "IOPS"), None);
}
