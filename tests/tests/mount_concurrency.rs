//! Many requests at once: threads doing O_DIRECT reads and writes at random offsets, checked
//! against a model, and fio's own verification at iodepth 16 over io_uring.
//!
//! The model: block `b` (4 KiB) is written only by thread `b % THREADS`, so its final
//! content is deterministic, but every thread reads every block. Each block carries its
//! version and index in its first 16 bytes and a pattern derived from both after that. A
//! read that overlapped no write of its block must return exactly the last completed
//! version; one that overlapped a write may see any version written meanwhile (or a torn
//! block: the kernel does not promise atomicity between concurrent read and write).

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, pattern, require_tool, AlignedBuf, Dispatch,
    MountedExport, Rng, Sandbox, MIB,
};

const LEN: u64 = 16 * MIB;
const BLOCK: usize = 4096;
const BLOCKS: usize = (LEN as usize) / BLOCK;
const THREADS: usize = 4;
const OPS: usize = 2000;

/// Version `version` of block `block`.
fn block_bytes(block: usize, version: u64) -> Vec<u8> {
    let mut bytes = pattern((block as u64) << 32 | version, 0, BLOCK);
    bytes[..8].copy_from_slice(&version.to_le_bytes());
    bytes[8..16].copy_from_slice(&(block as u64).to_le_bytes());
    bytes
}

/// Per block: the last version whose write started, and the last that completed.
struct Model {
    started: Vec<AtomicU64>,
    completed: Vec<AtomicU64>,
    strict_reads: AtomicUsize,
}

impl Model {
    fn new() -> Model {
        let zeroes = || (0..BLOCKS).map(|_| AtomicU64::new(0)).collect();
        Model {
            started: zeroes(),
            completed: zeroes(),
            strict_reads: AtomicUsize::new(0),
        }
    }

    fn write(&self, file: &fs::File, block: usize, buf: &mut AlignedBuf) {
        let version = self.completed[block].load(SeqCst) + 1;
        buf.copy_from_slice(&block_bytes(block, version));
        self.started[block].store(version, SeqCst);
        let n = file.write_at(buf, (block * BLOCK) as u64).unwrap();
        assert_eq!(n, BLOCK, "write of block {block}");
        self.completed[block].store(version, SeqCst);
    }

    fn read(&self, file: &fs::File, block: usize, buf: &mut AlignedBuf) {
        let done_before = self.completed[block].load(SeqCst);
        let started_before = self.started[block].load(SeqCst);
        file.read_exact_at(buf, (block * BLOCK) as u64).unwrap();
        let started_after = self.started[block].load(SeqCst);
        if started_before == done_before && started_after == started_before {
            self.strict_reads.fetch_add(1, SeqCst);
            assert_bytes_eq(
                buf,
                &block_bytes(block, done_before),
                &format!("block {block}"),
            );
        }
        // Otherwise the read overlapped a write of this block: any version, or a torn
        // block, is allowed.
    }

    fn run_thread(&self, mount: &Path, thread: usize) {
        let file = open_direct(mount, true).unwrap();
        let mut rng = Rng::new(0xC0F0 + thread as u64);
        let mut buf = AlignedBuf::zeroed(BLOCK);
        for _ in 0..OPS {
            let block = rng.below(BLOCKS as u64) as usize;
            if rng.below(2) == 0 {
                let own = block - block % THREADS + thread;
                self.write(&file, own, &mut buf);
            } else {
                self.read(&file, block, &mut buf);
            }
        }
    }

    fn expected_image(&self) -> Vec<u8> {
        (0..BLOCKS)
            .flat_map(|b| block_bytes(b, self.completed[b].load(SeqCst)))
            .collect()
    }
}

fn check_against_model(mode: Dispatch, args: &[&str]) {
    let sandbox = Sandbox::new();
    let model = Model::new();
    let image = sandbox.file("disk.img", &model.expected_image());
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (model, mount) = (&model, export.path());
            s.spawn(move || model.run_thread(mount, t));
        }
    });
    let strict = model.strict_reads.load(SeqCst);
    assert!(
        strict > THREADS * OPS / 4,
        "only {strict} reads were checked exactly"
    );
    export.stop();
    let expected = model.expected_image();
    assert_bytes_eq(&fs::read(&image).unwrap(), &expected, "image after unmount");
}

dispatch_tests!(mount_concurrent_direct_io_matches_the_model + ring);
fn mount_concurrent_direct_io_matches_the_model(mode: Dispatch) {
    check_against_model(mode, &["-w"]);
}

dispatch_tests!(mount_concurrent_direct_io_on_a_direct_image);
/// The image opened O_DIRECT; in coroutine mode, replies also go through the ring (a
/// transport option of that mode only). (Default readers: with many, the SIGTERM at the
/// end can hang, see `mount_sigterm_during_a_burst_with_many_readers`.)
fn mount_concurrent_direct_io_on_a_direct_image(mode: Dispatch) {
    if mode == Dispatch::Coroutine {
        check_against_model(mode, &["-w", "--direct", "--ring-replies"]);
    } else {
        check_against_model(mode, &["-w", "--direct"]);
    }
}

dispatch_tests!(mount_fio_randwrite_verify_crc32c + ring);
/// fio verifies what it wrote at iodepth 16 over io_uring (the packaged
/// qemu-storage-daemon's FUSE export fails this).
fn mount_fio_randwrite_verify_crc32c(mode: Dispatch) {
    require_tool!("fio");
    let sandbox = Sandbox::new();
    let image = sandbox.sparse("disk.img", LEN);
    let export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, &["-w"]);
    corofuse_tests::fio::randwrite_verify(export.path(), "16M", &sandbox.path(""));
    export.stop();
}
