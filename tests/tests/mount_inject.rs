//! `--inject SPEC`: each operation's error path through a real mount. The client sees
//! exactly the injected errno where the rule says, correct data everywhere else, and the
//! daemon goes on serving (and exits 0) after every fault; `--stats` counts what fired.
//!
//! The export answers OPEN with FOPEN_DIRECT_IO, so plain pread/pwrite reach the daemon
//! as they are (no page cache to hide a fault); one test also goes through O_DIRECT.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corofuse_tests::export::run_to_exit;
use corofuse_tests::mountinfo::fuse_mounts_at;
use corofuse_tests::sys::fallocate;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, errno_of, open_direct, open_rw, pattern, require_fuse,
    AlignedBuf, Dispatch, MountedExport, Sandbox, KIB, MIB,
};

const LEN: u64 = 4 * MIB;
const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

/// A writable export of a 4 MiB patterned image with `--inject SPEC` and `--stats`.
struct Injected {
    sandbox: Sandbox,
    image: PathBuf,
    export: MountedExport,
}

impl Injected {
    fn start(mode: Dispatch, spec: &str, args: &[&str]) -> Injected {
        // tmpfs where there is one: hole punching works there on every kernel.
        let sandbox = Sandbox::on_tmpfs().unwrap_or_default();
        let image = sandbox.file("disk.img", &pattern(1, 0, LEN as usize));
        let stats = sandbox.path("stats.json");
        let mut argv = vec!["-w", "--inject", spec, "--stats", stats.to_str().unwrap()];
        argv.extend(args);
        let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &argv);
        Injected {
            sandbox,
            image,
            export,
        }
    }

    fn file(&self) -> File {
        open_rw(self.export.path()).unwrap()
    }

    /// Stops the daemon (exit status 0, mount gone) and returns `--stats`'s `inject`.
    fn stop(self) -> (serde_json::Value, PathBuf, Sandbox) {
        self.export.stop();
        let text = fs::read_to_string(self.sandbox.path("stats.json")).unwrap();
        let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
        (stats["inject"].clone(), self.image, self.sandbox)
    }
}

/// `len` bytes at `offset` through `file` equal the original pattern (or `expected`).
#[track_caller]
fn assert_reads(file: &File, offset: u64, expected: &[u8], what: &str) {
    let mut buf = vec![0u8; expected.len()];
    file.read_exact_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("{what}: read at {offset}: {e}"));
    assert_bytes_eq(&buf, expected, what);
}

#[track_caller]
fn assert_original(file: &File, offset: u64, len: usize, what: &str) {
    assert_reads(file, offset, &pattern(1, offset, len), what);
}

/// The count of faults `--stats` reports for `op` and `errno`.
fn faults(inject: &serde_json::Value, op: &str, errno: &str) -> u64 {
    inject["faults_by_op"][op][errno].as_u64().unwrap_or(0)
}

dispatch_tests!(mount_inject_read_fails_in_its_range + ring);
fn mount_inject_read_fails_in_its_range(mode: Dispatch) {
    let inj = Injected::start(mode, "read@64K-128K:EIO", &[]);
    let file = inj.file();
    let mut buf = vec![0u8; 4096];
    for (offset, what) in [
        (64 * KIB, "start"),
        (124 * KIB, "end"),
        (62 * KIB, "straddle"),
    ] {
        let r = file.read_at(&mut buf, offset);
        assert_eq!(errno_of(r, what), libc::EIO, "read at {offset} ({what})");
    }
    // Through O_DIRECT too.
    let direct = open_direct(inj.export.path(), false).unwrap();
    let mut page = AlignedBuf::zeroed(4096);
    assert_eq!(
        errno_of(direct.read_at(&mut page, 96 * KIB), "direct"),
        libc::EIO
    );
    // Just outside, and far away: the right bytes, and writes still work.
    assert_original(&file, 60 * KIB, 4096, "before the range");
    assert_original(&file, 128 * KIB, 4096, "after the range");
    assert_eq!(direct.read_at(&mut page, MIB).unwrap(), 4096);
    assert_bytes_eq(&page, &pattern(1, MIB, 4096), "direct read outside");
    let data = pattern(2, 2 * MIB, 8192);
    file.write_all_at(&data, 2 * MIB).unwrap();
    assert_reads(&file, 2 * MIB, &data, "written after the faults");
    drop((file, direct));
    let (inject, ..) = inj.stop();
    assert_eq!(faults(&inject, "read", "EIO"), 4, "{inject}");
    assert_eq!(inject["faults"], 4, "{inject}");
}

dispatch_tests!(mount_inject_write_fails_in_its_range);
/// A failed write changes nothing; one outside the range lands. Buffered and `--direct`.
fn mount_inject_write_fails_in_its_range(mode: Dispatch) {
    for args in [&[][..], &["--direct"]] {
        let inj = Injected::start(mode, "write@1M-2M:ENOSPC", args);
        let file = inj.file();
        let data = pattern(3, 0, 8192);
        for offset in [MIB, 2 * MIB - 4096, MIB - 4096] {
            let r = file.write_at(&data, offset);
            assert_eq!(
                errno_of(r, "write"),
                libc::ENOSPC,
                "write at {offset} {args:?}"
            );
        }
        assert_original(&file, MIB - 4096, MIB as usize + 8192, "nothing written");
        file.write_all_at(&data, 3 * MIB).unwrap();
        file.write_all_at(&data, MIB - 8192).unwrap();
        assert_reads(&file, 3 * MIB, &data, "written outside");
        drop(file);
        let (inject, image, _sandbox) = inj.stop();
        assert_eq!(faults(&inject, "write", "ENOSPC"), 3, "{inject}");
        let mut expected = pattern(1, 0, LEN as usize);
        expected[3 * MIB as usize..][..8192].copy_from_slice(&data);
        expected[(MIB - 8192) as usize..][..8192].copy_from_slice(&data);
        assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image");
    }
}

dispatch_tests!(mount_inject_flush_fails_once);
/// fsync(2) and fdatasync(2) reach the backend's flush; the rule fails the first only.
fn mount_inject_flush_fails_once(mode: Dispatch) {
    let inj = Injected::start(mode, "flush:EIO:once", &[]);
    let file = inj.file();
    file.write_all_at(&[9; 4096], 0).unwrap();
    assert_eq!(errno_of(file.sync_all(), "fsync"), libc::EIO);
    file.sync_all().expect("the second fsync succeeds");
    file.sync_data().expect("fdatasync");
    assert_reads(&file, 0, &[9; 4096], "data after the failed fsync");
    drop(file); // FLUSH on close: succeeds
    let (inject, ..) = inj.stop();
    assert_eq!(faults(&inject, "flush", "EIO"), 1, "{inject}");
}

dispatch_tests!(mount_inject_close_flushes_only_what_could_write);
/// close(2) sends FLUSH: on a handle opened for writing it reaches the backend's flush
/// (and reports its error), on one opened for reading only it does not (nothing to make
/// durable; a down NBD server would otherwise hold every reader's close).
fn mount_inject_close_flushes_only_what_could_write(mode: Dispatch) {
    use std::os::fd::IntoRawFd;
    let close = |file: File| {
        // SAFETY: the descriptor is ours alone (just taken out of its File), closed once.
        let rc = unsafe { libc::close(file.into_raw_fd()) };
        (rc == 0)
            .then_some(())
            .ok_or_else(std::io::Error::last_os_error)
    };
    // Once: the read-only close would take it (and fail) if it flushed.
    let inj = Injected::start(mode, "flush:EIO:once", &[]);
    let reader = File::open(inj.export.path()).unwrap();
    assert_original(&reader, 0, 4096, "read before close");
    close(reader).expect("a read-only close flushes nothing");
    let writer = inj.file();
    writer.write_all_at(&[7; 4096], 0).unwrap();
    assert_eq!(errno_of(close(writer), "close"), libc::EIO);
    let (inject, ..) = inj.stop();
    assert_eq!(faults(&inject, "flush", "EIO"), 1, "{inject}");
}

dispatch_tests!(mount_inject_discard_and_zeroes_fail_in_their_ranges);
/// fallocate PUNCH_HOLE is `discard`, ZERO_RANGE is `zeroes`: each rule hits only its own.
fn mount_inject_discard_and_zeroes_fail_in_their_ranges(mode: Dispatch) {
    let spec = "discard@1M-2M:EIO,zeroes@2M-3M:EDQUOT";
    let inj = Injected::start(mode, spec, &[]);
    let file = inj.file();
    let zero = libc::FALLOC_FL_ZERO_RANGE;
    assert_eq!(
        errno_of(fallocate(&file, PUNCH, MIB, 64 * KIB), "punch"),
        libc::EIO
    );
    let r = fallocate(&file, zero, 2 * MIB + 4096, 4096);
    assert_eq!(errno_of(r, "zero range"), libc::EDQUOT);
    assert_original(&file, MIB, 2 * MIB as usize, "nothing zeroed");
    // The other kind in each range, and both kinds outside: done.
    fallocate(&file, zero, MIB, 4096).expect("ZERO_RANGE in the discard range");
    fallocate(&file, PUNCH, 2 * MIB, 4096).expect("PUNCH_HOLE in the zeroes range");
    fallocate(&file, PUNCH, 3 * MIB, 8192).expect("PUNCH_HOLE outside");
    fallocate(&file, zero, 3 * MIB + 8192, 8192).expect("ZERO_RANGE outside");
    for offset in [MIB, 2 * MIB] {
        assert_reads(&file, offset, &[0; 4096], "zeroed");
    }
    assert_reads(&file, 3 * MIB, &[0; 16384], "zeroed outside");
    assert_original(&file, MIB + 4096, 4096, "untouched");
    drop(file);
    let (inject, ..) = inj.stop();
    assert_eq!(faults(&inject, "discard", "EIO"), 1, "{inject}");
    assert_eq!(faults(&inject, "zeroes", "EDQUOT"), 1, "{inject}");
}

dispatch_tests!(mount_inject_resize_fails_in_its_range);
/// truncate(2) is `resize`; its bytes are those between the old and the new size.
fn mount_inject_resize_fails_in_its_range(mode: Dispatch) {
    let inj = Injected::start(mode, "resize@5M-:EDQUOT", &["--growable"]);
    let file = inj.file();
    assert_eq!(errno_of(file.set_len(6 * MIB), "grow to 6M"), libc::EDQUOT);
    assert_eq!(file.metadata().unwrap().len(), LEN, "size kept");
    file.set_len(5 * MIB)
        .expect("grow to 5M: outside the range");
    assert_eq!(
        errno_of(file.set_len(5 * MIB + 1), "grow by 1"),
        libc::EDQUOT
    );
    file.set_len(3 * MIB).expect("shrink");
    assert_eq!(file.metadata().unwrap().len(), 3 * MIB);
    assert_original(&file, 0, 3 * MIB as usize, "data kept");
    drop(file);
    let (inject, image, _sandbox) = inj.stop();
    assert_eq!(faults(&inject, "resize", "EDQUOT"), 2, "{inject}");
    assert_eq!(fs::metadata(image).unwrap().len(), 3 * MIB);
}

dispatch_tests!(mount_inject_enospc_after_size);
/// `after=SIZE`: at most SIZE bytes of writes succeed, then ENOSPC, like a full disk.
fn mount_inject_enospc_after_size(mode: Dispatch) {
    let inj = Injected::start(mode, "write:ENOSPC:after=256K", &[]);
    let file = inj.file();
    let chunk = 64 * KIB;
    let results: Vec<i32> = (0..6)
        .map(|i| {
            let data = pattern(4, i * chunk, chunk as usize);
            let r = file.write_all_at(&data, i * chunk);
            r.map_or_else(|e| e.raw_os_error().unwrap(), |()| 0)
        })
        .collect();
    assert_eq!(results, [0, 0, 0, 0, libc::ENOSPC, libc::ENOSPC]);
    assert_reads(
        &file,
        0,
        &pattern(4, 0, 4 * chunk as usize),
        "the writes that fit",
    );
    assert_original(&file, 4 * chunk, 2 * chunk as usize, "the writes refused");
    drop(file);
    let (inject, ..) = inj.stop();
    assert_eq!(faults(&inject, "write", "ENOSPC"), 2, "{inject}");
}

dispatch_tests!(mount_inject_probability_is_seeded_and_counted);
/// `N/M` with a seed: some reads fail, some succeed, the same ones each run, and
/// `--stats` counts exactly the failures the client saw.
fn mount_inject_probability_is_seeded_and_counted(mode: Dispatch) {
    let run = || {
        let inj = Injected::start(mode, "read:EIO:1/3,seed=42", &[]);
        let file = inj.file();
        let mut buf = vec![0u8; 4096];
        let failed: Vec<u64> = (0..60)
            .filter(|&i| match file.read_at(&mut buf, i * 4096) {
                Ok(n) => {
                    assert_eq!(n, 4096);
                    assert_bytes_eq(&buf, &pattern(1, i * 4096, 4096), "a read that passed");
                    false
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "read {i}: {e}");
                    true
                }
            })
            .collect();
        drop(file);
        let (inject, ..) = inj.stop();
        assert_eq!(
            faults(&inject, "read", "EIO"),
            failed.len() as u64,
            "{inject}"
        );
        assert_eq!(inject["rules"][0]["matched"], 60, "{inject}");
        assert_eq!(inject["seed"], 42, "{inject}");
        failed
    };
    let failed = run();
    assert!(
        (5..=35).contains(&failed.len()),
        "{} of 60 reads failed at 1/3: {failed:?}",
        failed.len()
    );
    assert_eq!(run(), failed, "the same seed fails the same reads");
}

dispatch_tests!(mount_inject_delay_holds_only_its_range + ring);
/// A delayed read takes at least the delay; except with inline dispatch (one request at
/// a time, by design) a read elsewhere meanwhile is not held up behind it.
fn mount_inject_delay_holds_only_its_range(mode: Dispatch) {
    const DELAY: Duration = Duration::from_millis(500);
    let inj = Injected::start(mode, "delay:read@0-4K:500ms", &[]);
    let path = inj.export.path().to_path_buf();
    let slow = std::thread::spawn(move || {
        let file = File::open(path).unwrap();
        let started = Instant::now();
        let mut buf = vec![0u8; 4096];
        file.read_exact_at(&mut buf, 0).unwrap();
        assert_bytes_eq(&buf, &pattern(1, 0, 4096), "the delayed read");
        started.elapsed()
    });
    std::thread::sleep(Duration::from_millis(50));
    let file = inj.file();
    let started = Instant::now();
    assert_original(&file, MIB, 4096, "a read elsewhere");
    let fast = started.elapsed();
    let slow = slow.join().unwrap();
    assert!(slow >= DELAY, "the delayed read took {slow:?}");
    if mode != Dispatch::Inline {
        assert!(fast < DELAY / 2, "a read outside the range waited {fast:?}");
    }
    drop(file);
    let (inject, ..) = inj.stop();
    assert_eq!(inject["delays_by_op"]["read"], 1, "{inject}");
    assert_eq!(inject["faults"], 0, "{inject}");
}

dispatch_tests!(mount_inject_wraps_the_null_backend);
/// A null image under the rules: injection wraps any backend.
fn mount_inject_wraps_the_null_backend(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let args = ["-w", "--inject", "write@4K-8K:EROFS,read@8K-12K:ENOMEM"];
    let export = MountedExport::start("null:1M", &sandbox.mountpoint("mnt"), mode, &args);
    let file = open_rw(export.path()).unwrap();
    assert_eq!(
        errno_of(file.write_at(&[1; 4096], 4096), "write"),
        libc::EROFS
    );
    let mut buf = vec![1u8; 4096];
    assert_eq!(errno_of(file.read_at(&mut buf, 8192), "read"), libc::ENOMEM);
    file.write_all_at(&[1; 4096], 0).unwrap();
    file.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0; 4096], "null reads zeroes");
    drop(file);
    export.stop();
}

/// A bad spec is a usage error: exit status 2, one line naming the bad part, no mount.
#[test]
fn mount_inject_bad_spec_is_refused() {
    require_fuse!();
    let sandbox = Sandbox::new();
    let image = sandbox.sparse("disk.img", MIB);
    let mnt = sandbox.mountpoint("mnt");
    let cases = [
        ("bogus", "rule \"bogus\""),
        ("read:EIOX", "unknown errno \"EIOX\""),
        ("read:EIO,writ:EIO", "unknown operation \"writ\""),
        ("read@2M-1M:EIO", "@2M-1M"),
        ("delay:read:5parsecs", "bad duration \"5parsecs\""),
        ("read:EIO:sometimes", "unknown condition \"sometimes\""),
        ("flush:ENOSYS", "ENOSYS cannot be injected"),
    ];
    for (spec, words) in cases {
        assert_refused(&image, &mnt, spec, &["--inject", words]);
    }
}

#[track_caller]
fn assert_refused(image: &Path, mnt: &Path, spec: &str, words: &[&str]) {
    let argv = ["mount", "-w", "--inject", spec].map(std::ffi::OsStr::new);
    let mut argv = argv.to_vec();
    argv.extend([image.as_os_str(), mnt.as_os_str()]);
    let exited = run_to_exit(&argv, mnt);
    let stderr = &exited.stderr;
    assert_eq!(exited.status.code(), Some(2), "{spec}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{spec}: {stderr}");
    for word in words {
        assert!(stderr.contains(word), "{spec}: {word:?} not in {stderr}");
    }
    assert_eq!(fuse_mounts_at(&fs::canonicalize(mnt).unwrap()), 0);
}
