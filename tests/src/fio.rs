//! fio against a mount: random writes at depth over io_uring, then fio's own read-back
//! verification of every block it wrote.

use std::fs;
use std::path::Path;
use std::process::Command;

/// Runs fio's 4 KiB O_DIRECT random writes at iodepth 16 over io_uring on `file` (the
/// first `size` bytes, e.g. "16M"), verified by crc32c; panics with fio's report if it
/// fails or finds a bad block. `scratch` holds fio's output.
#[track_caller]
pub fn randwrite_verify(file: &Path, size: &str, scratch: &Path) {
    let output = scratch.join("fio.out");
    let status = Command::new("fio")
        .args([
            "--name=corofuse",
            "--ioengine=io_uring",
            "--iodepth=16",
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--verify_state_save=0",
        ])
        .arg(format!("--size={size}"))
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--output={}", output.display()))
        .current_dir(scratch)
        .status()
        .expect("run fio");
    let report = fs::read_to_string(&output).unwrap_or_default();
    assert!(status.success(), "fio failed ({status}):\n{report}");
    assert!(
        !report.contains("verify: bad"),
        "fio reports bad blocks:\n{report}"
    );
}
