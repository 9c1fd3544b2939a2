//! The write log (`--record-writes`): replaying the image-level records of a whole log
//! onto a copy of the image as it was before gives the image byte for byte (raw, and qcow2
//! v2 and v3, where the log is taken under the qcow2 layer), in a coroutine and on a
//! thread; the size cap fails the write that would pass it with ENOSPC before it reaches
//! the image.

mod util;

use std::fs;
use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;

use backend::record::{self, format, Kind, Level, WriteLog};
use backend::{BlockBackend, Ctx, OpenOptions};
use corofuse_tests::qcow2::create;
use corofuse_tests::{pattern, require_tool, Rng, Seed};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: false,
    format: backend::Format::Auto,
    snapshot: None,
};

/// Random writes (some in several pieces), zeroes, discards, flushes and a growth.
fn workload(cx: &Ctx<'_>, disk: &dyn BlockBackend, rng: &mut Rng, ops: usize) {
    for i in 0..ops {
        let len = disk.len();
        let at = rng.below(len);
        let n = (1 + rng.below(150 * 1024)).min(len - at);
        match rng.below(12) {
            0 => disk.write_zeroes(cx, at, n, rng.below(2) == 0).unwrap(),
            1 => disk.discard(cx, at, n).unwrap(),
            2 | 3 => disk.flush(cx).unwrap(),
            4 if i == ops / 2 => disk.resize(cx, len + 1024 * 1024).unwrap(),
            _ => {
                let data = pattern(rng.next_u64(), at, n as usize);
                let (a, b) = data.split_at(rng.below(n + 1) as usize);
                disk.writev(cx, &[IoSlice::new(a), IoSlice::new(b)], at)
                    .unwrap();
            }
        }
    }
}

/// Records `ops` operations on `image`, then replays the log onto `base` (a copy of the
/// image from before) and compares.
fn record_and_replay(cx: &Ctx<'_>, image: &Path, seed: u64) {
    let base = image.with_extension("base");
    fs::copy(image, &base).unwrap();
    let log_path = image.with_extension("log");
    let log = Arc::new(WriteLog::create(&log_path, record::DEFAULT_CAP).unwrap());
    let disk = backend::open_recorded(image.to_str().unwrap(), &RW, &log).unwrap();
    assert!(
        disk.describe().contains("recording writes"),
        "{}",
        disk.describe()
    );
    workload(cx, &*disk, &mut Rng::new(seed), 300);
    drop(disk); // qcow2: the close's flushes and header write are recorded too
    let read = format::read_log(fs::File::open(&log_path).unwrap(), "log").unwrap();
    assert_eq!(read.truncated, None);
    assert_eq!(fs::metadata(&log_path).unwrap().len(), log.bytes());
    let image_level = read.records.iter().filter(|r| r.head.level == Level::Image);
    assert!(image_level.clone().any(|r| r.head.kind == Kind::Flush));
    let copy = fs::OpenOptions::new().write(true).open(&base).unwrap();
    let done = record::replay(&read.records, Level::Image, &copy).unwrap();
    assert_eq!(done.failed, 0);
    let (want, got) = (fs::read(image).unwrap(), fs::read(&base).unwrap());
    assert!(
        want == got,
        "seed {seed}: the replay of {} records differs from {image:?}",
        done.applied
    );
}

fn raw_replays_byte_for_byte(cx: &Ctx<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    fs::write(&image, pattern(7, 0, 4 << 20)).unwrap();
    record_and_replay(cx, &image, Seed::choose().value());
}

fn qcow2_replays_byte_for_byte(cx: &Ctx<'_>) {
    let dir = tempfile::tempdir().unwrap();
    for opts in ["compat=0.10", "compat=1.1", "compat=1.1,cluster_size=512"] {
        let image = dir.path().join("disk.qcow2");
        create(&image, opts, Some("4M"));
        let seed = Seed::choose().value();
        record_and_replay(cx, &image, seed);
        // The guest level holds what the export asked: the same workload's writes.
        let read = format::read_log(fs::File::open(image.with_extension("log")).unwrap(), "l");
        let guest = read.unwrap().records;
        let writes = guest
            .iter()
            .filter(|r| r.head.level == Level::Guest && r.head.kind == Kind::Write);
        assert!(writes.count() > 100, "{opts}: guest writes recorded");
    }
}

#[test]
fn record_raw_replays_byte_for_byte() {
    util::each_ctx(raw_replays_byte_for_byte);
}

#[test]
fn record_qcow2_replays_byte_for_byte() {
    require_tool!("qemu-img");
    util::each_ctx(qcow2_replays_byte_for_byte);
}

#[test]
fn record_a_full_log_fails_the_write_before_it_reaches_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let log_path = dir.path().join("w.log");
    let log = Arc::new(WriteLog::create(&log_path, 32 + 40 + 4096).unwrap());
    let disk = backend::open_recorded(image.to_str().unwrap(), &RW, &log).unwrap();
    let cx = Ctx::Blocking;
    disk.writev(&cx, &[IoSlice::new(&[1u8; 4096])], 0).unwrap();
    let err = disk
        .writev(&cx, &[IoSlice::new(&[2u8; 512])], 8192)
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    disk.flush(&cx)
        .expect("a flush is still recorded past the cap");
    let on_disk = fs::read(&image).unwrap();
    assert_eq!(
        on_disk[8192], 0,
        "the refused write never reached the image"
    );
    let read = format::read_log(fs::File::open(&log_path).unwrap(), "log").unwrap();
    let kinds: Vec<_> = read.records.iter().map(|r| r.head.kind).collect();
    assert_eq!(kinds, [Kind::Write, Kind::Flush]);
}
