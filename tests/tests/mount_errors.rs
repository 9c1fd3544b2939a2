//! Setup errors: each one exits non-zero with one line on stderr that names the problem,
//! writes no pidfile and leaves no mount. Setup is the same in every `--dispatch` mode, so
//! these run once (in the default mode), plus one check that bad modes are refused.

use std::fs;

use corofuse_tests::export::assert_setup_error;
use corofuse_tests::{require_fuse, Dispatch, MountedExport, Sandbox, MIB};

fn image(sandbox: &Sandbox) -> std::path::PathBuf {
    sandbox.sparse("disk.img", MIB)
}

#[test]
fn mount_error_missing_image() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let missing = sandbox.path("missing.img");
    let mnt = sandbox.mountpoint("mnt");
    assert_setup_error(
        &sandbox,
        missing.as_os_str(),
        &mnt,
        &[],
        &["missing.img", "No such file"],
    );
    assert_setup_error(
        &sandbox,
        missing.as_os_str(),
        &mnt,
        &["-w"],
        &["No such file"],
    );
}

#[test]
fn mount_error_missing_mountpoint() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let mnt = sandbox.path("nope");
    assert_setup_error(
        &sandbox,
        image.as_os_str(),
        &mnt,
        &["-w"],
        &["nope", "does not exist"],
    );
    assert!(!mnt.exists(), "the mountpoint must not be created");
}

#[test]
fn mount_error_mountpoint_is_a_directory() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let dir = sandbox.path("dir");
    fs::create_dir(&dir).unwrap();
    let stderr = assert_setup_error(&sandbox, image.as_os_str(), &dir, &[], &["dir"]);
    let why = ["is a directory", "not a regular file"];
    assert!(why.iter().any(|w| stderr.contains(w)), "{stderr}");
}

#[test]
fn mount_error_mountpoint_already_mounted() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let other = sandbox.sparse("other.img", MIB);
    let first = MountedExport::start(&image, &sandbox.mountpoint("mnt"), Dispatch::Coroutine, &[]);
    assert_setup_error(
        &sandbox,
        other.as_os_str(),
        first.path(),
        &["-w"],
        &["already a FUSE mountpoint"],
    );
    // The first export is untouched and still serves.
    assert_eq!(fs::read(first.path()).unwrap().len(), MIB as usize);
    first.stop();
}

#[test]
fn mount_error_growable_without_writable() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let mnt = sandbox.mountpoint("mnt");
    assert_setup_error(
        &sandbox,
        image.as_os_str(),
        &mnt,
        &["--growable"],
        &["--growable", "-w"],
    );
}

#[test]
fn mount_error_bad_null_size() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let mnt = sandbox.mountpoint("mnt");
    for spec in ["null:abc", "null:1X", "null:"] {
        assert_setup_error(&sandbox, spec.as_ref(), &mnt, &[], &[spec, "size"]);
    }
    assert_setup_error(&sandbox, "null".as_ref(), &mnt, &[], &["null:1G"]);
}

/// `--dispatch` takes `coroutine`, `inline` or `threads:N` with N from 1; anything else is
/// refused with one line naming the option and the value, before anything is mounted.
#[test]
fn mount_error_bad_dispatch() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let mnt = sandbox.mountpoint("mnt");
    for mode in ["threads:0", "bogus"] {
        let args = ["-w", "--dispatch", mode];
        assert_setup_error(
            &sandbox,
            image.as_os_str(),
            &mnt,
            &args,
            &["--dispatch", mode],
        );
    }
}

/// `--queues` is for the loop modes (threads:N has its own queues), takes 1 to 256; `--cpus`
/// takes a comma-separated list of CPU numbers.
#[test]
fn mount_error_bad_queues_or_cpus() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let mnt = sandbox.mountpoint("mnt");
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--queues", "2", "--dispatch", "threads:2"],
            &["--queues", "threads:2"],
        ),
        (&["--queues", "0"], &["--queues", "0"]),
        (&["--cpus", "x"], &["--cpus", "x"]),
        (&["--cpus", ""], &["--cpus"]),
        // Checked before mounting: a CPU this process may not run on.
        (&["--cpus", "0,4095"], &["--cpus", "4095", "may run on"]),
    ];
    for (args, words) in cases {
        assert_setup_error(&sandbox, image.as_os_str(), &mnt, args, words);
    }
}

/// `--transport uring` needs the fuse module's `enable_uring` (it says how to turn it on)
/// and the coroutine dispatch.
#[test]
fn mount_error_uring_unavailable_or_wrong_dispatch() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = image(&sandbox);
    let mnt = sandbox.mountpoint("mnt");
    let off = corofuse_tests::uring::with_enable_uring("N", || {
        assert_setup_error(
            &sandbox,
            image.as_os_str(),
            &mnt,
            &["--transport", "uring"],
            &["--transport uring", "enable_uring", "echo Y"],
        )
    });
    if let Err(why) = off {
        corofuse_tests::require::report_skip(&format!("cannot switch enable_uring: {why}"));
    }
    assert_setup_error(
        &sandbox,
        image.as_os_str(),
        &mnt,
        &["--transport", "uring", "--dispatch", "inline"],
        &["--transport uring", "coroutine", "inline"],
    );
}
