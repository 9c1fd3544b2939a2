//! `corofuse bench --only nbd --compare-qsd` with tiny sizes (an 8 MiB storage image,
//! 0.2 s runs): the nbd row runs once with corofuse, qsd's `driver=nbd` and, where fio
//! has its nbd engine, the limit (fio straight at qemu-nbd), prints IOPS and the ratio to
//! that limit, and leaves no qemu-nbd, mount or scratch file behind. The speed is not
//! checked.

use std::path::Path;
use std::process::Command;

use corofuse_tests::lab_run::TinyBench;
use corofuse_tests::{require_fuse, require_tool};

/// Whether fio here has the nbd engine (the limit runs only then).
fn fio_has_nbd() -> bool {
    Command::new("fio")
        .arg("--enghelp=nbd")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("uri"))
}

/// Processes whose command line mentions `dir` (a qemu-nbd left behind would).
fn processes_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir))
        .collect()
}

#[test]
fn mount_bench_nbd_row_runs_once_with_tiny_sizes() {
    require_fuse!();
    require_tool!("qemu-nbd", "qemu-storage-daemon");
    let run = TinyBench::run("nbd");
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    let limit = fio_has_nbd();
    // Two workloads, each with corofuse, qsd and (where fio can) the limit; no device row.
    let runs = if limit { 6 } else { 4 };
    assert!(stderr.contains(&format!("[{runs}/{runs}]")), "{stderr}");
    assert!(!stdout.contains("\ndevice "), "{stdout}");
    assert!(stdout.contains("qemu-nbd (-f raw"), "{stdout}");

    // export, 4-word workload, server, IOPS, vs limit.
    for workload in ["randread 4k psync qd1", "randwrite 4k io_uring qd64"] {
        for server in ["corofuse", "qsd"] {
            let f = run.fields("nbd", workload, server);
            assert!(f[6].parse::<f64>().is_ok_and(|v| v > 0.0), "{f:?}");
            assert!(!limit || f[7].ends_with('x'), "{f:?}");
        }
        if limit {
            let f = run.fields("nbd", workload, "fio nbd");
            assert!(f[7].parse::<f64>().is_ok_and(|v| v > 0.0), "{f:?}");
            assert_eq!(f[8], "limit", "{f:?}");
        } else {
            assert!(stdout.contains("No limit"), "{stdout}");
        }
    }
    assert!(
        processes_under(run.scratch.path()).is_empty(),
        "qemu-nbd is stopped: {:?}",
        processes_under(run.scratch.path())
    );
    assert!(
        std::fs::read_dir(run.scratch.path())
            .unwrap()
            .next()
            .is_none(),
        "the scratch directory is removed"
    );
}
