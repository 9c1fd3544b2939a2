//! The L2 entries of copied-on-write clusters wait for the next flush (qcow2 `deferred.rs`)
//! instead of a sync per cluster: the image level of the write log shows no sync per
//! copy, and the deferred entries are served meanwhile (across L2 cache evictions, past
//! the most that may wait, updated again before a flush) and reach the file at the flush:
//! the image reopens with every byte and `qemu-img check` finds nothing.

use std::fs;
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend::record::format::read_log;
use backend::record::{self, Kind, Level, WriteLog};
use backend::{BlockBackend, Ctx, OpenOptions};
use corofuse_tests::qcow2::{assert_check_clean, create};
use corofuse_tests::{pattern, require_tool};

const RW: OpenOptions = OpenOptions {
    writable: true,
    direct: false,
    lock: true,
    format: backend::Format::Qcow2,
    snapshot: None,
};
const MIB: u64 = 1 << 20;

/// A qcow2 image (`opts`) over a sparse raw backing file of `size` bytes, whose bytes
/// around each of `spots` are a pattern (so a lost copy reads as zeroes, not as them).
fn over_backing(dir: &Path, opts: &str, size: u64, spots: &[u64], span: u64) -> PathBuf {
    let backing = dir.join("backing.raw");
    let file = fs::File::create(&backing).unwrap();
    file.set_len(size).unwrap();
    for &at in spots {
        file.write_all_at(&pattern(9, at, span as usize), at)
            .unwrap();
    }
    let image = dir.join("over.qcow2");
    let opts = format!("{opts},backing_file={},backing_fmt=raw", backing.display());
    create(&image, &opts, None);
    image
}

fn read(disk: &dyn BlockBackend, at: u64, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    let n = disk
        .readv(&Ctx::Blocking, &mut [IoSliceMut::new(&mut got)], at)
        .unwrap();
    assert_eq!(n as u64, len);
    got
}

fn write(disk: &dyn BlockBackend, data: &[u8], at: u64) {
    disk.writev(&Ctx::Blocking, &[IoSlice::new(data)], at)
        .unwrap_or_else(|e| panic!("write {} at {at}: {e}", data.len()));
}

/// What `[at, at + span)` must read: the backing file's pattern with `data` at `within`.
fn expected(at: u64, span: u64, within: u64, data: &[u8]) -> Vec<u8> {
    let mut want = pattern(9, at, span as usize);
    want[within as usize..within as usize + data.len()].copy_from_slice(data);
    want
}

/// Partial writes into clusters over a backing file, each at `spots[i] + within`, read
/// back before the flush, after it, and after a reopen; `qemu-img check` clean at the end.
fn copies_read_back(image: &Path, spots: &[u64], span: u64, within: u64, len: usize) {
    let data = |i: usize| pattern(i as u64 + 100, spots[i] + within, len);
    let verify = |disk: &dyn BlockBackend, when: &str| {
        for (i, &at) in spots.iter().enumerate() {
            let want = expected(at, span, within, &data(i));
            corofuse_tests::assert_bytes_eq(&read(disk, at, span), &want, when);
        }
    };
    let disk = backend::open(image.to_str().unwrap(), &RW).unwrap();
    for (i, &at) in spots.iter().enumerate() {
        write(&*disk, &data(i), at + within);
    }
    verify(&*disk, "before the flush");
    disk.flush(&Ctx::Blocking).unwrap();
    verify(&*disk, "after the flush");
    drop(disk);
    let disk = backend::open(image.to_str().unwrap(), &RW).unwrap();
    verify(&*disk, "reopened");
    drop(disk);
    assert_check_clean(image, "after the copies");
}

/// 160 L2 tables' worth of copies in a 80 GiB image: the cache keeps 64 tables of 64 KiB
/// clusters, so most tables holding deferred entries are evicted and read again before the
/// flush; the entries must be laid over them.
#[test]
fn qcow2_deferred_entries_survive_l2_cache_evictions() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let table_span = 512 * MIB; // guest bytes one L2 table maps
    let spots: Vec<u64> = (0..160).map(|t| t * table_span + 3 * 65536).collect();
    let image = over_backing(dir.path(), "compat=1.1", 160 * table_span, &spots, 65536);
    copies_read_back(&image, &spots, 65536, 8192, 4096);
}

/// More copies between two flushes than entries may wait (`MAX_DEFERRED`, 32768): the
/// excess writes back first, and nothing is lost.
#[test]
fn qcow2_deferred_entries_past_the_most_that_wait() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let spots: Vec<u64> = (0..34000).map(|c| c * 1024).collect(); // every other cluster
    let size = 34000 * 1024;
    let image = over_backing(dir.path(), "compat=1.1,cluster_size=512", size, &spots, 512);
    copies_read_back(&image, &spots, 512, 100, 300);
}

/// A copied cluster discarded (v3: a zero entry) and one written over whole before the
/// flush: the later entry wins on disk, not the deferred copy's.
#[test]
fn qcow2_deferred_entry_updated_again_before_the_flush() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let spots = [0, 65536, 2 * 65536];
    let image = over_backing(dir.path(), "compat=1.1", 4 * MIB, &spots, 65536);
    let cx = Ctx::Blocking;
    let disk = backend::open(image.to_str().unwrap(), &RW).unwrap();
    for &at in &spots {
        write(&*disk, &[0xee; 4096], at + 4096); // copies, deferred
    }
    disk.discard(&cx, 0, 65536).unwrap();
    write(&*disk, &[0x77; 65536], 65536);
    disk.write_zeroes(&cx, 2 * 65536, 65536, false).unwrap();
    disk.flush(&cx).unwrap();
    drop(disk);
    let disk = backend::open(image.to_str().unwrap(), &RW).unwrap();
    assert_eq!(read(&*disk, 0, 65536), vec![0; 65536], "discarded");
    assert_eq!(read(&*disk, 65536, 65536), vec![0x77; 65536], "rewritten");
    assert_eq!(read(&*disk, 2 * 65536, 65536), vec![0; 65536], "zeroed");
    drop(disk);
    assert_check_clean(&image, "after the updates");
}

/// Copies do not sync the image each: 300 partial writes over a backing file and no
/// flush asked reach the image file with a handful of syncs (the allocator's
/// reservations), where a sync per copy made them ~1k IOPS on ext4.
#[test]
fn qcow2_copies_do_not_sync_each() {
    require_tool!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let spots: Vec<u64> = (0..300).map(|c| c * 65536).collect();
    let image = over_backing(dir.path(), "compat=1.1", 300 * 65536, &spots, 65536);
    let log_path = dir.path().join("w.log");
    let log = Arc::new(WriteLog::create(&log_path, record::DEFAULT_CAP).unwrap());
    let disk = backend::open_recorded(image.to_str().unwrap(), &RW, &log).unwrap();
    for &at in &spots {
        write(&*disk, &[0xee; 4096], at + 8192);
    }
    drop(disk);
    drop(log);
    let log = read_log(fs::File::open(&log_path).unwrap(), "log").unwrap();
    let syncs = log
        .records
        .iter()
        .filter(|r| r.head.level == Level::Image)
        .filter(|r| matches!(r.head.kind, Kind::Flush | Kind::DurableWrite))
        .count();
    // The open's dirty bit, a reservation or two, and the close's syncs.
    assert!(syncs < 20, "{syncs} syncs of the image for 300 copies");
}
