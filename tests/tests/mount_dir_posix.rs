//! pjdfstest through `corofuse mount-dir`, against pjdfstest on the source file system
//! itself: every test of the suite that passes on a scratch directory must pass through
//! a mount of another scratch directory on the same file system, except the known
//! differences below, each a limit of a FUSE passthrough rather than of this server.
//!
//! The whole suite (about 400 tests, a few seconds) runs once on the source per test
//! process and once through the mount per dispatch mode. The mount is `--allow-other`
//! (the suite switches to `nobody` and `daemon` for its permission tests, and the kernel
//! checks them: `default_permissions`), with the default caches. The EXDEV tests get a
//! directory on another file system (tmpfs if there is one); the EROFS tests need a
//! remount and are skipped on both sides.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use corofuse_tests::pjdfstest::{self, Outcome, Results};
use corofuse_tests::require::{note, report_skip, tool_missing};
use corofuse_tests::{dispatch_tests, Dispatch, MountedExport};
use tempfile::TempDir;

/// Tests that pass on the source but not through the mount, and why that is no defect of
/// the export. Each must still differ: one that passes through the mount again fails the
/// test until it is taken off this list.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[(
    "link::link_count_max",
    "skipped through FUSE: glibc's pathconf(_PC_LINK_MAX) knows no limit for a FUSE file \
     system (FUSE's STATFS has no field for it, so it answers 127, 'unknown'), and the \
     test's guard skips it; LINK refusals past the source's limit pass through (EMLINK)",
)];

/// A scratch directory every user may enter (pjdfstest acts as `nobody` in it).
fn open_dir_in(parent: &Path) -> TempDir {
    let dir = tempfile::tempdir_in(parent).expect("scratch directory");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A directory on another file system than `source`'s, for the EXDEV tests: tmpfs, else
/// /var/tmp or the build's target directory, whichever is another device.
fn other_fs(source: &Path) -> Option<TempDir> {
    let dev = fs::metadata(source).ok()?.dev();
    let target = corofuse_tests::bin::corofuse()
        .parent()
        .map(Path::to_path_buf);
    [
        Some(PathBuf::from("/dev/shm")),
        Some("/var/tmp".into()),
        target,
    ]
    .into_iter()
    .flatten()
    .filter(|p| fs::metadata(p).is_ok_and(|m| m.is_dir() && m.dev() != dev))
    .find_map(|p| tempfile::tempdir_in(p).ok())
}

/// The configuration file for this machine's accounts, in `dir`.
fn write_config(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join("pjdfstest.toml");
    fs::write(&path, pjdfstest::config(&pjdfstest::users()?)).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The suite run on a scratch source directory, once per test process.
fn on_the_source() -> &'static Result<Results, String> {
    static DIRECT: OnceLock<Result<Results, String>> = OnceLock::new();
    DIRECT.get_or_init(|| {
        let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config = write_config(scratch.path())?;
        let source = open_dir_in(&std::env::temp_dir());
        let other = other_fs(source.path());
        let (results, _) =
            pjdfstest::run(source.path(), &config, other.as_ref().map(TempDir::path))?;
        note(&format!("pjdfstest on the source: {}", results.summary()));
        Ok(results)
    })
}

/// What differs between the source's results and the mount's, unexplained, and the
/// known differences that no longer differ.
fn compare(source: &Results, mount: &Results) -> (Vec<String>, Vec<&'static str>) {
    let known: BTreeMap<&str, &str> = KNOWN_DIFFERENCES.iter().copied().collect();
    let missing = Outcome::Other("not run through the mount".into());
    let mut unexplained = Vec::new();
    for (name, outcome) in &source.tests {
        let through = mount.tests.get(name).unwrap_or(&missing);
        if *outcome == Outcome::Passed
            && *through != Outcome::Passed
            && !known.contains_key(name.as_str())
        {
            unexplained.push(format!(
                "{name}: ok on the source, {through} through the mount"
            ));
        }
        if *outcome != Outcome::Passed && *through == Outcome::Passed {
            note(&format!(
                "pjdfstest {name}: {outcome} on the source, ok through the mount"
            ));
        }
    }
    let stale = KNOWN_DIFFERENCES
        .iter()
        .map(|&(name, _)| name)
        .filter(|name| {
            source.tests.get(*name) == Some(&Outcome::Passed)
                && mount.tests.get(*name) == Some(&Outcome::Passed)
        })
        .collect();
    (unexplained, stale)
}

dispatch_tests!(mount_dir_passes_pjdfstest_as_the_source_does[coroutine, threads, uring]);
fn mount_dir_passes_pjdfstest_as_the_source_does(mode: Dispatch) {
    pjdfstest_through_a_mount(mode, &[]);
}

dispatch_tests!(mount_dir_passes_pjdfstest_with_passthrough_always_and_never[coroutine]);
/// The default is `--passthrough auto`; the suite passes with every policy.
fn mount_dir_passes_pjdfstest_with_passthrough_always_and_never(mode: Dispatch) {
    pjdfstest_through_a_mount(mode, &["--passthrough", "always"]);
    pjdfstest_through_a_mount(mode, &["--passthrough", "never"]);
}

fn pjdfstest_through_a_mount(mode: Dispatch, args: &[&str]) {
    if let Some(why) = tool_missing(pjdfstest::PJDFSTEST) {
        return report_skip(&why);
    }
    let source_results = match on_the_source() {
        Ok(results) => results,
        Err(why) if why.contains("/etc/") => return report_skip(why),
        Err(why) => panic!("pjdfstest on the source: {why}"),
    };
    let (passed, _, _) = source_results.counts();
    assert!(
        passed >= 300,
        "pjdfstest passed only {passed} tests on the source: {}",
        source_results.summary()
    );
    let scratch = tempfile::tempdir().unwrap();
    let config = write_config(scratch.path()).unwrap();
    let source = open_dir_in(&std::env::temp_dir());
    let mnt = open_dir_in(&std::env::temp_dir());
    let other = other_fs(source.path());
    let mut all_args = vec!["--allow-other"];
    all_args.extend_from_slice(args);
    let export = MountedExport::start_dir(source.path(), mnt.path(), mode, &all_args);
    let run = pjdfstest::run(export.path(), &config, other.as_ref().map(TempDir::path));
    let (mount_results, ran) = run.unwrap_or_else(|e| panic!("{e}\ndaemon:\n{}", export.stderr()));
    note(&format!(
        "pjdfstest through the mount ({mode} {}): {} (on the source: {})",
        args.join(" "),
        mount_results.summary(),
        source_results.summary()
    ));
    let (unexplained, stale) = compare(source_results, &mount_results);
    assert!(
        unexplained.is_empty(),
        "pjdfstest through the mount ({mode} {}) differs from the source:\n{}\n\
         (fix the export, or explain it in KNOWN_DIFFERENCES)\npjdfstest output:\n{}\n\
         daemon:\n{}",
        args.join(" "),
        unexplained.join("\n"),
        ran.stdout,
        export.stderr()
    );
    assert!(
        stale.is_empty(),
        "known differences that pass through the mount now: take them off \
         KNOWN_DIFFERENCES: {stale:?}"
    );
    export.stop();
}

dispatch_tests!(mount_dir_passes_pjdfstest_with_metadata_off_the_loop[coroutine]);
/// `--metadata off-loop` (the default on a network or FUSE source): LOOKUP through the
/// ring, every other metadata request on a helper thread with the caller's credentials;
/// the suite passes as with the calls on the loop.
fn mount_dir_passes_pjdfstest_with_metadata_off_the_loop(mode: Dispatch) {
    pjdfstest_through_a_mount(mode, &["--metadata", "off-loop"]);
}
