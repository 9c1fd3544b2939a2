//! Probe, then skip visibly: what a mount test needs, and a message on the real stderr
//! when it is missing (libtest captures `eprintln!`, not writes to the stderr handle).
//!
//! With [`NO_SKIP_ENV`]`=1` (`.ci/run` sets it) a skip is a failure instead: CI, which
//! has root, /dev/fuse, the tools and a recent kernel, cannot pass with tests unrun.
//! Leaving a dispatch mode out on purpose (`COROFUSE_TEST_DISPATCH`) still only skips.

use std::fs;
use std::io::Write;

/// Set to anything but empty or `0`, it makes every [`report_skip`] panic.
pub const NO_SKIP_ENV: &str = "COROFUSE_TEST_NO_SKIP";

/// Why this process cannot mount a FUSE file system with mount(2), if it cannot: it needs
/// euid 0, CAP_SYS_ADMIN and a /dev/fuse it can open (`fuse::mount::mount_unavailable`).
pub fn fuse_unavailable() -> Option<String> {
    fuse::mount::mount_unavailable()
}

/// Why `tool` cannot run, if it is not on the PATH.
pub fn tool_missing(tool: &str) -> Option<String> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file());
    (!found).then(|| format!("`{tool}` is not installed (.ci/run installs it)"))
}

/// Why this kernel cannot do `what`, if it is older than Linux `major.minor` (by
/// /proc/sys/kernel/osrelease; a release that does not parse counts as new enough).
pub fn kernel_older_than(major: u32, minor: u32, what: &str) -> Option<String> {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let release = release.trim();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>());
    let (Some(Ok(have_major)), Some(Ok(have_minor))) = (numbers.next(), numbers.next()) else {
        return None;
    };
    ((have_major, have_minor) < (major, minor))
        .then(|| format!("Linux {release} is older than {major}.{minor}, which {what} needs"))
}

/// Prints `SKIPPED <test>: <why>` where the person running the tests sees it; panics
/// with `why` instead if [`NO_SKIP_ENV`] is set.
pub fn report_skip(why: &str) {
    let strict = std::env::var(NO_SKIP_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    skip_or_fail(why, strict);
}

/// Prints `SKIPPED <test>: <why>` for a test left out on purpose (never a failure).
pub fn report_deselected(why: &str) {
    note(&format!("SKIPPED {}: {why}", test_name()));
}

fn skip_or_fail(why: &str, fail: bool) {
    if fail {
        panic!(
            "{} cannot run: {why}; with {NO_SKIP_ENV}=1 (as .ci/run sets it) that is a \
             failure, not a skip",
            test_name()
        );
    }
    report_deselected(why);
}

/// The running test's name (libtest names its thread after it).
fn test_name() -> String {
    let thread = std::thread::current();
    thread.name().unwrap_or("a test").to_string()
}

/// Writes one line to the process's stderr, past libtest's capture (which only covers
/// `print!`/`eprint!`), so that it shows even for a passing test.
pub fn note(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Returns from the calling test, saying why, unless FUSE mounts can be made here.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = $crate::require::fuse_unavailable() {
            $crate::require::report_skip(&why);
            return;
        }
    };
}

/// Returns from the calling test, saying why, unless each tool named is on the PATH.
#[macro_export]
macro_rules! require_tool {
    ($($tool:expr),+) => {
        $(
            if let Some(why) = $crate::require::tool_missing($tool) {
                $crate::require::report_skip(&why);
                return;
            }
        )+
    };
}

/// Returns from the calling test, saying why, if the kernel is older than `major.minor`,
/// which `what` needs.
#[macro_export]
macro_rules! require_kernel {
    ($major:expr, $minor:expr, $what:expr) => {
        if let Some(why) = $crate::require::kernel_older_than($major, $minor, $what) {
            $crate::require::report_skip(&why);
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Output};

    /// Set only in the children of [`a_skip_is_a_note_by_default`]: there that test makes
    /// one real skip.
    const CHILD_ENV: &str = "COROFUSE_TEST_REQUIRE_CHILD";
    const WHY: &str = "not a real skip: the test of report_skip itself";

    /// This test's name as libtest knows it (`require::tests::…`).
    fn this_test() -> String {
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        format!("{module}::a_skip_is_a_note_by_default")
    }

    /// Runs this test alone in a child of this test binary, with [`NO_SKIP_ENV`] unset
    /// (`None`) or set to `no_skip`, libtest capturing as usual; its exit status and its
    /// stdout and stderr together.
    fn child(no_skip: Option<&str>) -> (Output, String) {
        let exe = std::env::current_exe().expect("the test binary");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", &this_test()])
            .env(CHILD_ENV, "1")
            .env_remove(NO_SKIP_ENV);
        if let Some(value) = no_skip {
            cmd.env(NO_SKIP_ENV, value);
        }
        let out = cmd.output().expect("run the test binary");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out, text)
    }

    /// `report_skip` itself, in a child process (the environment variable is the child's
    /// own, so no test running beside this one sees it change): without
    /// [`NO_SKIP_ENV`], or with it empty or `0`, the skip prints `SKIPPED <test>: <why>`
    /// past libtest's capture and the test passes; with it `1` the test fails, saying so.
    #[test]
    fn a_skip_is_a_note_by_default() {
        if std::env::var_os(CHILD_ENV).is_some() {
            return report_skip(WHY);
        }
        let note = format!("SKIPPED {}: {WHY}\n", this_test());
        for no_skip in [None, Some(""), Some("0")] {
            let (out, text) = child(no_skip);
            assert!(
                out.status.success(),
                "{NO_SKIP_ENV}={no_skip:?}: a skip failed the test:\n{text}"
            );
            assert!(
                text.contains("1 passed") && text.contains(&note),
                "{NO_SKIP_ENV}={no_skip:?}: no `{note}` from the one test run:\n{text}"
            );
        }
        let (out, text) = child(Some("1"));
        assert!(
            !out.status.success(),
            "{NO_SKIP_ENV}=1: a skip passed:\n{text}"
        );
        let failure = format!(
            "{} cannot run: {WHY}; with {NO_SKIP_ENV}=1 (as .ci/run sets it) that is a \
             failure, not a skip",
            this_test()
        );
        assert!(
            text.contains("1 failed") && text.contains(&failure) && !text.contains(&note),
            "{NO_SKIP_ENV}=1: not the one failure `{failure}`:\n{text}"
        );
    }

    #[test]
    #[should_panic(expected = "cannot run: no /dev/fuse; with COROFUSE_TEST_NO_SKIP=1")]
    fn a_skip_fails_when_skips_are_not_allowed() {
        skip_or_fail("no /dev/fuse", true);
    }
}
