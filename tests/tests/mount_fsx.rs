//! fsx (the File System eXerciser, installed by `.ci/run`) on a file inside a
//! `corofuse mount-dir` mount and on the file `corofuse mount -w` exports an image as: a
//! seeded random sequence of reads, writes, mapped reads and writes with msync, truncates,
//! fallocate, hole punching, copy_file_range, sendfile, fsync and reopen, every read
//! checked against what fsx expects the file to hold.
//!
//! The run is bounded (a fixed number of operations, a few seconds) and reproducible: the
//! seed is fixed, printed, and `COROFUSE_TEST_SEED=N` replays another. On failure the
//! assertion shows fsx's own log (the last operations before the bad read) and the
//! daemon's stderr. The image export is a file of fixed size, so fsx runs there in its
//! block mode (no truncate, no fallocate, no size checks, offsets within the image).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use corofuse_tests::buf::SEED_ENV;
use corofuse_tests::require::{note, report_skip, tool_missing};
use corofuse_tests::tool::run_bounded;
use corofuse_tests::{dispatch_tests, Dispatch, MountedExport, Sandbox, Seed, MIB};

const FSX: &str = "fsx";

/// The seed unless `COROFUSE_TEST_SEED` names another.
const SEED: u64 = 20_261_201;

/// How long one fsx run may take before the test fails (it takes seconds).
const LIMIT: Duration = Duration::from_secs(300);

/// Every operation fsx has, at its usual weights (reads and writes, plain and mapped,
/// the most frequent); `flen` is the largest size the file takes.
const FILE_CONFIG: &str = "flen = 262144\n\
    [opsize]\nmax = 65536\n\
    [weights]\nclose_open = 1\nread = 10\nwrite = 10\nmapread = 10\nmapwrite = 10\n\
    invalidate = 1\ntruncate = 2\nfsync = 1\nfdatasync = 1\nposix_fallocate = 1\n\
    punch_hole = 1\nsendfile = 1\nposix_fadvise = 1\ncopy_file_range = 1\n";

/// Block mode for an image of `len` bytes: the size never changes.
fn block_config(len: u64) -> String {
    format!(
        "flen = {len}\nblockmode = true\nnosizechecks = true\n\
         [opsize]\nmax = 131072\n\
         [weights]\nclose_open = 0\nread = 10\nwrite = 10\nmapread = 10\nmapwrite = 10\n\
         invalidate = 1\ntruncate = 0\nfsync = 1\nfdatasync = 1\nposix_fallocate = 0\n\
         punch_hole = 1\nsendfile = 1\nposix_fadvise = 1\ncopy_file_range = 1\n"
    )
}

/// Runs `fsx -N ops -S seed -f config -P artifacts file` and asserts that it finished
/// with every read as expected.
#[track_caller]
fn exercise(export: &MountedExport, file: &Path, config: &str, ops: u64, what: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let config_path = scratch.path().join("fsx.toml");
    fs::write(&config_path, config).unwrap();
    // Alive to the end: on a panic it prints how to replay.
    let chosen = Seed::fixed(SEED);
    let seed = chosen.value();
    note(&format!(
        "fsx on {what}: {ops} operations, seed {seed} (replay: {SEED_ENV}={seed})"
    ));
    let mut command = Command::new(FSX);
    command
        .arg("-N")
        .arg(ops.to_string())
        .arg("-S")
        .arg(seed.to_string())
        .arg("-f")
        .arg(&config_path)
        .arg("-P")
        .arg(scratch.path())
        .arg(file)
        .env("RUST_LOG", "warn");
    let ran = run_bounded(&mut command, LIMIT)
        .unwrap_or_else(|e| panic!("fsx on {what}: {e}\ndaemon:\n{}", export.stderr()));
    assert!(
        ran.status.success() && ran.stdout.contains("All operations completed A-OK"),
        "fsx on {what} failed (seed {seed}): {}\ndaemon:\n{}",
        ran.describe(),
        export.stderr()
    );
}

dispatch_tests!(mount_dir_passes_fsx[coroutine, threads]);
fn mount_dir_passes_fsx(mode: Dispatch) {
    fsx_in_dir_mount(mode, &[], 20_000);
}

dispatch_tests!(mount_dir_passes_fsx_with_passthrough_always_and_never[coroutine, uring]);
/// The default (`--passthrough auto`) runs above; here every open passed through
/// (`always`: reads, writes and mappings go to the source file, attributes still come
/// from the daemon) and none (`never`).
fn mount_dir_passes_fsx_with_passthrough_always_and_never(mode: Dispatch) {
    fsx_in_dir_mount(mode, &["--passthrough", "always"], 10_000);
    fsx_in_dir_mount(mode, &["--passthrough", "never"], 10_000);
}

dispatch_tests!(mount_dir_passes_fsx_uncached[coroutine]);
/// `--cache never`: every read and write reaches the daemon, mapped pages are written back
/// around them (DIRECT_IO_ALLOW_MMAP).
fn mount_dir_passes_fsx_uncached(mode: Dispatch) {
    fsx_in_dir_mount(mode, &["--cache", "never"], 10_000);
}

fn fsx_in_dir_mount(mode: Dispatch, args: &[&str], ops: u64) {
    if let Some(why) = tool_missing(FSX) {
        return report_skip(&why);
    }
    // On tmpfs where there is one: fsx's msync and fsync then cost no disk flushes.
    let sandbox = Sandbox::on_tmpfs().unwrap_or_default();
    let source = sandbox.path("source");
    fs::create_dir(&source).unwrap();
    let mnt = sandbox.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let export = MountedExport::start_dir(&source, &mnt, mode, args);
    let file = export.path().join("fsx.file");
    let what = match args {
        [] => format!("a file in the dir mount ({mode})"),
        _ => format!("a file in the dir mount ({mode} {})", args.join(" ")),
    };
    exercise(&export, &file, FILE_CONFIG, ops, &what);
    export.stop();
}

dispatch_tests!(mount_image_passes_fsx[coroutine]);
fn mount_image_passes_fsx(mode: Dispatch) {
    if let Some(why) = tool_missing(FSX) {
        return report_skip(&why);
    }
    const LEN: u64 = MIB;
    let sandbox = Sandbox::on_tmpfs().unwrap_or_default();
    let image = sandbox.sparse("disk.img", LEN);
    for (args, what) in [
        (&["-w"][..], "the image export"),
        (
            &["-w", "--format", "raw", "--passthrough"][..],
            "the image export with --passthrough",
        ),
    ] {
        let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
        let file = export.path().to_path_buf();
        exercise(&export, &file, &block_config(LEN), 10_000, what);
        export.stop();
    }
}
