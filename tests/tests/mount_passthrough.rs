//! FUSE passthrough (Linux 6.9+): the directory export's `--passthrough auto|always|never`
//! and the raw image export's `--passthrough`, on every transport. What passes through is
//! seen in `--stats`: opens counted under `passthrough`, and the READ and WRITE requests
//! the daemon did (or did not) serve.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use corofuse_tests::export::read_stats;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, pattern, Access, AlignedBuf, Dispatch, Mapping,
    MountedExport, Sandbox, Sharing, MIB,
};

/// Requests of `op` ("READ", "WRITE") the daemon served, from a `--stats` document.
fn served(json: &serde_json::Value, op: &str) -> u64 {
    json["ops"][op]["count"].as_u64().unwrap_or(0)
}

/// Opens answered with FOPEN_PASSTHROUGH.
fn passed(json: &serde_json::Value) -> u64 {
    json["passthrough"]["opens"].as_u64().unwrap_or(0)
}

/// A directory export of a source holding `data` as `f`, with `args`; runs `f` on the
/// mounted `f`, then returns the `--stats` document at exit.
fn with_dir_export(
    mode: Dispatch,
    args: &[&str],
    data: &[u8],
    f: impl FnOnce(&Path, &Path),
) -> serde_json::Value {
    let sandbox = Sandbox::new();
    let (src, mnt) = (sandbox.path("src"), sandbox.path("mnt"));
    fs::create_dir(&src).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(src.join("f"), data).unwrap();
    let stats = sandbox.path("stats.json");
    let mut all = vec!["--stats", stats.to_str().unwrap()];
    all.extend_from_slice(args);
    let export = MountedExport::start_dir(&src, &mnt, mode, &all);
    f(&export.path().join("f"), &src.join("f"));
    export.stop();
    read_stats(&stats)
}

dispatch_tests!(mount_passthrough_dir_reads_and_buffered_writes_skip_the_daemon);
/// The default (`auto`): a file read and written (buffered) through the mount is the
/// source's, byte for byte, its size seen at once, and no READ or WRITE reached the
/// daemon; a shared mapping writes through to the source.
fn mount_passthrough_dir_reads_and_buffered_writes_skip_the_daemon(mode: Dispatch) {
    let data = pattern(1, 0, 3 * MIB as usize);
    let json = with_dir_export(mode, &[], &data, |file, source| {
        assert_bytes_eq(&fs::read(file).unwrap(), &data, "read through the mount");
        let w = OpenOptions::new().write(true).open(file).unwrap();
        let more = pattern(2, 0, 8192);
        w.write_all_at(&more, 3 * MIB).unwrap();
        drop(w);
        assert_eq!(
            fs::metadata(file).unwrap().len(),
            3 * MIB + 8192,
            "size after the write"
        );
        assert_eq!(
            fs::read(source).unwrap()[3 * MIB as usize..],
            more[..],
            "on the source"
        );
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .unwrap();
        let map = Mapping::map(&f, 0, 4096, Access::ReadWrite, Sharing::Shared).unwrap();
        map.write(0, b"hello");
        map.sync_all().unwrap();
        drop(map);
        assert_eq!(
            &fs::read(source).unwrap()[..5],
            b"hello",
            "mapped write on the source"
        );
    });
    assert!(passed(&json) >= 3, "{json}");
    assert_eq!(json["passthrough"]["enabled"], true, "{json}");
    assert_eq!(served(&json, "READ"), 0, "reads passed through: {json}");
    assert_eq!(served(&json, "WRITE"), 0, "writes passed through: {json}");
}

dispatch_tests!(mount_passthrough_dir_direct_writers_stay_on_the_daemon[coroutine, threads, uring]);
/// `auto`: an O_DIRECT writer's reads and writes reach the daemon (in parallel), while a
/// reader of the same file at the same time passes through; both see every byte.
fn mount_passthrough_dir_direct_writers_stay_on_the_daemon(mode: Dispatch) {
    let data = pattern(3, 0, MIB as usize);
    let json = with_dir_export(mode, &[], &data, |file, source| {
        let reader = fs::File::open(file).unwrap();
        let writer = open_direct(file, true).unwrap();
        let block = AlignedBuf::from_slice(&pattern(4, 4096, 4096));
        writer.write_all_at(&block, 4096).unwrap();
        let mut back = AlignedBuf::zeroed(4096);
        writer.read_exact_at(&mut back, 4096).unwrap();
        assert_bytes_eq(&back, &block, "read back through the writer");
        let mut seen = vec![0u8; 4096];
        reader.read_exact_at(&mut seen, 4096).unwrap();
        assert_bytes_eq(&seen, &block, "the passthrough reader sees it");
        assert_bytes_eq(
            &fs::read(source).unwrap()[4096..8192],
            &block,
            "on the source",
        );
    });
    assert!(
        served(&json, "WRITE") >= 1,
        "the O_DIRECT write reached the daemon: {json}"
    );
    assert!(passed(&json) >= 2, "{json}");
}

dispatch_tests!(mount_passthrough_dir_policies_always_and_never[coroutine, threads]);
/// `always` passes O_DIRECT writers through too; `never` serves every read and write.
fn mount_passthrough_dir_policies_always_and_never(mode: Dispatch) {
    let data = pattern(5, 0, MIB as usize);
    let direct_write = |file: &Path, source: &Path| {
        let writer = open_direct(file, true).unwrap();
        let block = AlignedBuf::from_slice(&pattern(6, 0, 4096));
        writer.write_all_at(&block, 0).unwrap();
        drop(writer);
        assert_bytes_eq(&fs::read(file).unwrap()[..4096], &block, "read back");
        assert_bytes_eq(&fs::read(source).unwrap()[..4096], &block, "on the source");
    };
    let always = with_dir_export(mode, &["--passthrough", "always"], &data, direct_write);
    assert_eq!(served(&always, "WRITE"), 0, "always: {always}");
    assert_eq!(served(&always, "READ"), 0, "always: {always}");
    let never = with_dir_export(mode, &["--passthrough", "never"], &data, direct_write);
    assert!(
        served(&never, "WRITE") >= 1 && served(&never, "READ") >= 1,
        "never: {never}"
    );
    assert!(
        never.get("passthrough").is_none_or(|p| p.is_null()),
        "never: {never}"
    );
}

dispatch_tests!(mount_passthrough_dir_with_writeback_is_off[coroutine]);
/// The kernel has no passthrough beside the writeback cache: `--writeback` serves every
/// open as before (and says so once).
fn mount_passthrough_dir_with_writeback_is_off(mode: Dispatch) {
    let data = pattern(7, 0, 65536);
    let json = with_dir_export(mode, &["--writeback"], &data, |file, _| {
        assert_bytes_eq(&fs::read(file).unwrap(), &data, "read");
    });
    assert_eq!(passed(&json), 0, "{json}");
    assert!(served(&json, "READ") >= 1, "{json}");
}

dispatch_tests!(mount_passthrough_image_reads_pass_and_writes_keep_the_size);
/// `mount --passthrough` of a raw image: a read-only open reads the image file itself
/// (no READ reaches the daemon), a writable open is served (a write past the end is still
/// refused, the size stays exact), and both see the same bytes.
fn mount_passthrough_image_reads_pass_and_writes_keep_the_size(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let len = 2 * MIB as usize + 512;
    let data = pattern(8, 0, len);
    let image = sandbox.file("disk.img", &data);
    let stats = sandbox.path("stats.json");
    let args = [
        "-w",
        "--format",
        "raw",
        "--passthrough",
        "--stats",
        stats.to_str().unwrap(),
    ];
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &args);
    let m = export.path();
    assert_bytes_eq(
        &fs::read(m).unwrap(),
        &data,
        "read-only open, passed through",
    );
    // A reader held open: the writer beside it is in the passthrough family, its reads
    // and writes still served (alone, it is served as without passthrough: fsx runs
    // that, with mappings, in tests/tests/mount_fsx.rs).
    let reader = fs::File::open(m).unwrap();
    let w = OpenOptions::new().write(true).open(m).unwrap();
    w.write_all_at(b"written", 100).unwrap();
    let past = w.write_at(b"x", len as u64).map_err(|e| e.raw_os_error());
    assert_eq!(past, Err(Some(libc::ENOSPC)), "past the end");
    drop(w);
    let mut seen = [0u8; 7];
    reader.read_exact_at(&mut seen, 100).unwrap();
    assert_eq!(
        &seen, b"written",
        "the passthrough reader sees the served write"
    );
    drop(reader);
    assert_eq!(fs::metadata(m).unwrap().len(), len as u64);
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m)
        .unwrap();
    let mut back = AlignedBuf::zeroed(4096);
    r.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(
        &back[100..107],
        b"written",
        "an O_DIRECT reader passes through too"
    );
    drop(r);
    export.stop();
    // The kernel keeps a registered file until the connection is gone: what it keeps
    // must not be the descriptor holding the image's write lock, or this next export
    // would find the image locked.
    let again = MountedExport::start(
        &image,
        &sandbox.mountpoint("mnt"),
        mode,
        &["-w", "--format", "raw", "--passthrough"],
    );
    assert_bytes_eq(
        &fs::read(again.path()).unwrap()[..100],
        &data[..100],
        "again",
    );
    again.stop();
    assert_eq!(
        fs::metadata(&image).unwrap().len(),
        len as u64,
        "image size"
    );
    let json = read_stats(&stats);
    assert_eq!(served(&json, "READ"), 0, "{json}");
    assert!(served(&json, "WRITE") >= 1, "{json}");
    assert!(passed(&json) >= 4, "{json}");
    assert!(
        json["passthrough"]["registered"].as_u64().unwrap() >= 1,
        "{json}"
    );
}

#[test]
fn mount_passthrough_image_refuses_what_is_not_a_raw_file() {
    corofuse_tests::require_fuse!();
    let sandbox = Sandbox::new();
    let mnt = sandbox.mountpoint("mnt");
    let null = corofuse_tests::export::run_to_exit(
        &[
            "mount".as_ref(),
            "null:1M".as_ref(),
            mnt.as_os_str(),
            "--passthrough".as_ref(),
        ],
        &mnt,
    );
    assert!(!null.status.success());
    assert!(
        null.stderr.contains("--passthrough needs a raw image file"),
        "{}",
        null.stderr
    );
    let image = sandbox.file("disk.img", &[0u8; 4096]);
    let inject = corofuse_tests::export::run_to_exit(
        &[
            "mount".as_ref(),
            image.as_os_str(),
            mnt.as_os_str(),
            "--passthrough".as_ref(),
            "--inject".as_ref(),
            "read:EIO".as_ref(),
        ],
        &mnt,
    );
    assert!(!inject.status.success());
    assert!(
        inject.stderr.contains("--passthrough needs"),
        "{}",
        inject.stderr
    );
    // Writable without --format: the first sector of a probed raw image is checked on
    // every write, which a mapping passed through would skip.
    let probed = corofuse_tests::export::run_to_exit(
        &[
            "mount".as_ref(),
            image.as_os_str(),
            mnt.as_os_str(),
            "-w".as_ref(),
            "--passthrough".as_ref(),
        ],
        &mnt,
    );
    assert!(!probed.status.success());
    assert!(
        probed
            .stderr
            .contains("--passthrough with -w needs --format raw"),
        "{}",
        probed.stderr
    );
}
