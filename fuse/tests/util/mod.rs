//! Helpers shared by tests that mount for real.
//!
//! CI runs as root with /dev/fuse, so these tests run by default. Where root, /dev/fuse
//! or CAP_SYS_ADMIN is missing, [`require_mount`] reports the skip as
//! `corofuse_tests::require::report_skip` does (a crate the `tests` crate depends on
//! cannot use it): `SKIPPED <test>: <why>` straight to stderr, past libtest's capture,
//! and the test returns early; under `COROFUSE_TEST_NO_SKIP=1` (as `.ci/run` sets it) the
//! test fails instead.

use std::io::Write;

/// True if this test can mount (`fuse::mount::mount_unavailable`); otherwise reports the
/// skip with [`report_skip`], which fails the test under `COROFUSE_TEST_NO_SKIP=1`.
pub fn require_mount() -> bool {
    match fuse::mount::mount_unavailable() {
        None => true,
        Some(why) => {
            report_skip(&why);
            false
        }
    }
}

/// Prints `SKIPPED <test>: <why>` past libtest's capture; panics instead where
/// `COROFUSE_TEST_NO_SKIP` is set to anything but empty or `0`: there every test runs.
/// The same words as `corofuse_tests::require::report_skip`.
pub fn report_skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let strict = std::env::var("COROFUSE_TEST_NO_SKIP").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !strict,
        "{test} cannot run: {why}; with COROFUSE_TEST_NO_SKIP=1 (as .ci/run sets it) that \
         is a failure, not a skip"
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// True if /proc/mounts lists `path` (escaped as the kernel does for spaces).
pub fn in_proc_mounts(path: &std::path::Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(wanted.as_str()))
}
