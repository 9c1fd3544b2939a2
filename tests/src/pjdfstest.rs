//! pjdfstest (the Rust rewrite of the POSIX file-system test suite, installed by
//! `.ci/run`): its configuration written for this machine, a run on a directory, and its
//! per-test results parsed, so that a test can compare the suite on a source directory
//! with the same suite through a mount of another.
//!
//! Why parse and compare instead of asking for a clean run: which tests pass depends on
//! the file system under the source (ext4, tmpfs, xfs answer some corner cases
//! differently), so the export's contract is relative: whatever passes on the source must
//! pass through the mount.
//!
//! pjdfstest prints one line per test, `NAME<padding> ok|FAILED|skipped`, then
//! tab-indented lines with the reason (a failed assertion, a missing feature). Tests that
//! act as another user take two accounts from the configuration: `nobody` and `daemon`
//! with their primary groups, which a Debian system has (read from /etc/passwd and
//! /etc/group, not created).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::tool::{run_bounded, Ran};

/// The program's name on the PATH.
pub const PJDFSTEST: &str = "pjdfstest";

/// The accounts the tests switch to (`[dummy_auth]`): user names, primary groups looked up.
pub const USERS: [&str; 2] = ["nobody", "daemon"];

/// How long one run of the whole suite may take (it takes a few seconds).
pub const LIMIT: Duration = Duration::from_secs(300);

/// What became of one test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `ok`.
    Passed,
    /// `FAILED`, with the reason it printed.
    Failed(String),
    /// `skipped`, with the reason (a missing feature, a guard).
    Skipped(String),
    /// Any other status (`failed as expected`, `PASSED UNEXPECTEDLY`: unused here).
    Other(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Passed => f.write_str("ok"),
            Outcome::Failed(why) => write!(f, "FAILED ({why})"),
            Outcome::Skipped(why) => write!(f, "skipped ({why})"),
            Outcome::Other(status) => f.write_str(status),
        }
    }
}

/// One run's results, by test name (`rename::write_access_required_subdir`).
#[derive(Clone, Debug, Default)]
pub struct Results {
    /// Each test's outcome.
    pub tests: BTreeMap<String, Outcome>,
}

impl Results {
    /// Counts: passed, failed, skipped (anything else counts as failed).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for outcome in self.tests.values() {
            match outcome {
                Outcome::Passed => c.0 += 1,
                Outcome::Skipped(_) => c.2 += 1,
                _ => c.1 += 1,
            }
        }
        c
    }

    /// `N passed, N failed, N skipped`.
    pub fn summary(&self) -> String {
        let (p, f, s) = self.counts();
        format!("{p} passed, {f} failed, {s} skipped")
    }
}

/// Parses pjdfstest's output (see the module docs); lines that are neither a result nor
/// a reason (the summary, backtraces) are ignored.
pub fn parse(output: &str) -> Results {
    let mut results = Results::default();
    let mut last: Option<String> = None;
    for line in output.lines() {
        if let Some(reason) = line.strip_prefix('\t') {
            let Some(name) = &last else { continue };
            let reason = reason.trim();
            match results.tests.get_mut(name) {
                Some(Outcome::Failed(why) | Outcome::Skipped(why)) if why.is_empty() => {
                    *why = reason.to_string();
                }
                Some(Outcome::Failed(why) | Outcome::Skipped(why)) => {
                    why.push_str("; ");
                    why.push_str(reason);
                }
                _ => {}
            }
            continue;
        }
        let Some((name, status)) = line.split_once(' ') else {
            continue;
        };
        if !name.contains("::") || name.starts_with(char::is_whitespace) {
            continue;
        }
        let outcome = match status.trim() {
            "ok" => Outcome::Passed,
            "FAILED" => Outcome::Failed(String::new()),
            "skipped" => Outcome::Skipped(String::new()),
            other => Outcome::Other(other.to_string()),
        };
        results.tests.insert(name.to_string(), outcome);
        last = Some(name.to_string());
    }
    results
}

/// The configuration file's text: every opt-in feature Linux file systems have, short
/// naps (ext4 and tmpfs keep nanosecond times), no remounts (the EROFS tests need one),
/// and `users` as the accounts to switch to.
pub fn config(users: &[(String, String); 2]) -> String {
    format!(
        "[features]\nposix_fallocate = {{}}\nutimensat = {{}}\nutime_now = {{}}\n\
         rename_ctime = {{}}\n\n[settings]\nnaptime = 0.01\nallow_remount = false\n\n\
         [dummy_auth]\nentries = [[\"{}\", \"{}\"], [\"{}\", \"{}\"]]\n",
        users[0].0, users[0].1, users[1].0, users[1].1
    )
}

/// [`USERS`] with their primary groups' names, from /etc/passwd and /etc/group; `Err`
/// says which is missing.
pub fn users() -> Result<[(String, String); 2], String> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    let group = fs::read_to_string("/etc/group").map_err(|e| format!("/etc/group: {e}"))?;
    let field = |line: &str, n: usize| line.split(':').nth(n).map(str::to_string);
    let find = |user: &str| -> Result<(String, String), String> {
        let gid = passwd
            .lines()
            .find(|l| field(l, 0).as_deref() == Some(user))
            .and_then(|l| field(l, 3))
            .ok_or_else(|| format!("no user `{user}` in /etc/passwd (pjdfstest acts as it)"))?;
        let name = group
            .lines()
            .find(|l| field(l, 2).as_deref() == Some(gid.as_str()))
            .and_then(|l| field(l, 0))
            .ok_or_else(|| format!("no group {gid} (`{user}`'s) in /etc/group"))?;
        Ok((user.to_string(), name))
    };
    Ok([find(USERS[0])?, find(USERS[1])?])
}

/// Runs the whole suite in `dir` (which must let every user through: mode 0755 or more
/// on it and its parents) with the configuration file `config`, and `secondary` as the
/// other file system of the EXDEV tests, if given. `Err` if it did not run to the end
/// (no summary line) or ran no test.
pub fn run(dir: &Path, config: &Path, secondary: Option<&Path>) -> Result<(Results, Ran), String> {
    let mut command = Command::new(PJDFSTEST);
    command
        .arg("-c")
        .arg(config)
        .arg("-p")
        .arg(dir)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    if let Some(other) = secondary {
        command.arg("-s").arg(other);
    }
    let ran = run_bounded(&mut command, LIMIT)?;
    let results = parse(&ran.stdout);
    if !ran.stdout.contains("Summary:") || results.tests.is_empty() {
        return Err(format!(
            "pjdfstest in {} did not run its tests: {}",
            dir.display(),
            ran.describe()
        ));
    }
    Ok((results, ran))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_results_and_reasons() {
        let out = "chmod::bits::x                                                          ok\n\
                   rename::write_access_required_subdir                                      FAILED\n\
                   \tassertion failed: matches!(rename(a, b), Ok(_))\n\
                   Backtrace:\n   0: pjdfstest::main\n\
                   link::link_count_max                                                     skipped\n\
                   \tCannot get value for LINK_MAX: filesystem limit is unknown\n\
                   \n\
                   Summary: 1 failed, 1 skipped, 1 passed, 0 expected failures, 3 total\n";
        let r = parse(out);
        assert_eq!(r.tests.len(), 3);
        assert_eq!(r.tests["chmod::bits::x"], Outcome::Passed);
        assert_eq!(
            r.tests["rename::write_access_required_subdir"],
            Outcome::Failed("assertion failed: matches!(rename(a, b), Ok(_))".into())
        );
        assert!(matches!(
            &r.tests["link::link_count_max"],
            Outcome::Skipped(why) if why.contains("LINK_MAX")
        ));
        assert_eq!(r.counts(), (1, 1, 1));
    }

    #[test]
    fn the_configuration_names_both_users() {
        let users = [
            ("nobody".to_string(), "nogroup".to_string()),
            ("daemon".to_string(), "daemon".to_string()),
        ];
        let text = config(&users);
        assert!(text.contains(r#"entries = [["nobody", "nogroup"], ["daemon", "daemon"]]"#));
        assert!(text.contains("posix_fallocate = {}"));
    }
}
