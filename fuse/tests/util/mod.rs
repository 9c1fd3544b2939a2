//! Helpers shared by tests that mount for real.
//!
//! CI runs as root with /dev/fuse, so these tests run by default. Where root
//! or /dev/fuse is missing, [`require_mount`] prints why the test skips,
//! straight to stderr so that libtest's capture cannot hide it, and the test
//! returns early; under `COROFUSE_TEST_NO_SKIP=1` it fails instead.

use std::io::Write;

/// Bit of CAP_SYS_ADMIN in the capability masks of /proc/self/status.
const CAP_SYS_ADMIN: u32 = 21;

/// The value of a `Name:\tvalue` line of /proc/self/status.
fn status_field(status: &str, name: &str) -> Option<String> {
    let line = status.lines().find(|l| l.starts_with(name))?;
    Some(line[name.len()..].trim().to_string())
}

/// Why mounting is impossible here, or `None` if it is possible.
fn missing_requirement() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let euid =
        status_field(&status, "Uid:").and_then(|u| u.split_whitespace().nth(1).map(String::from));
    if euid.as_deref() != Some("0") {
        return Some(format!("not root (euid {})", euid.unwrap_or_default()));
    }
    let caps = status_field(&status, "CapEff:").and_then(|c| u64::from_str_radix(&c, 16).ok());
    if caps.is_some_and(|c| c & (1 << CAP_SYS_ADMIN) == 0) {
        return Some("root without CAP_SYS_ADMIN".into());
    }
    fuse::dev::FuseDev::open().err().map(|err| err.to_string())
}

/// True if this test can mount; otherwise prints `SKIP <test>: <why>`, or, where
/// `COROFUSE_TEST_NO_SKIP` is set (as `.ci/run` sets it), fails: there every test runs.
pub fn require_mount(test: &str) -> bool {
    match missing_requirement() {
        None => true,
        Some(why) => {
            let strict =
                std::env::var("COROFUSE_TEST_NO_SKIP").is_ok_and(|v| !v.is_empty() && v != "0");
            assert!(
                !strict,
                "{test} cannot run: {why}; with COROFUSE_TEST_NO_SKIP=1 that is a failure"
            );
            let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
            false
        }
    }
}

/// True if /proc/mounts lists `path` (escaped as the kernel does for spaces).
pub fn in_proc_mounts(path: &std::path::Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(wanted.as_str()))
}
