//! Crash durability: once a write and then fsync(2) or fdatasync(2) return through the
//! mount, SIGKILL of the daemon loses none of it.
//!
//! Each test writes patterned data through the mount, some of it synced with fdatasync
//! and some with fsync, while another thread keeps writing (never synced) elsewhere in the
//! image; then SIGKILL to the daemon, `corofuse umount` of the mount it leaves, and the
//! image file itself must hold every synced byte, and the bytes no write touched as they
//! were. The client writes buffered, with O_DIRECT or into a shared mapping (msync(2) then
//! standing for fdatasync), and the daemon runs with `--direct` (image on a disk-backed
//! file system) or without, in every dispatch mode.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc};

use corofuse_tests::export::{wait_for_progress, TIMEOUT};
use corofuse_tests::require::report_skip;
use corofuse_tests::{
    assert_bytes_eq, dispatch_tests, open_direct, open_rw, pattern, require_kernel, Access,
    AlignedBuf, Dispatch, Mapping, MountedExport, Sandbox, Sharing, KIB, MIB,
};

/// The image; the synced writes go to its first half, the unsynced ones to the second.
const LEN: u64 = 4 * MIB;
const HALF: u64 = LEN / 2;
/// The unsynced writer's chunk.
const CHUNK: u64 = 64 * KIB;

/// How the client writes to the mount.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    /// write(2) on a plain fd.
    Buffered,
    /// write(2) on an O_DIRECT fd.
    Direct,
    /// Stores into a shared mapping (the kernel writes the dirty pages back): msync(2)
    /// instead of fdatasync, then fsync. Its unsynced writer uses a plain fd.
    Mapped,
}

impl Client {
    fn open(self, path: &Path) -> File {
        match self {
            Client::Buffered | Client::Mapped => open_rw(path),
            Client::Direct => open_direct(path, true),
        }
        .expect("open the mount")
    }

    /// (offset, length) of the synced writes, in two batches (fdatasync after the first,
    /// fsync after the second), all inside the first half. O_DIRECT writes are 4 KiB
    /// aligned; buffered ones mostly not. The second batch overwrites part of the first.
    fn writes(self) -> [&'static [(u64, u64)]; 2] {
        const DIRECT: [&[(u64, u64)]; 2] = [
            &[(0, 4096), (64 * KIB, 64 * KIB), (512 * KIB, MIB)],
            &[
                (96 * KIB, 8192),
                (HALF - 8192, 8192),
                (768 * KIB, 128 * KIB),
            ],
        ];
        const BUFFERED: [&[(u64, u64)]; 2] = [
            &[
                (1, 100),
                (4095, 2),
                (64 * KIB + 17, 70_000),
                (512 * KIB, MIB),
            ],
            &[
                (100 * KIB + 1, 5000),
                (HALF - 5000, 5000),
                (700 * KIB + 3, 200_000),
            ],
        ];
        match self {
            Client::Buffered | Client::Mapped => BUFFERED,
            Client::Direct => DIRECT,
        }
    }
}

/// The synced writes' way in: an fd, or a shared mapping of the whole file and its fd.
enum Handle {
    Fd(File),
    Mapped(Mapping, File),
}

impl Handle {
    fn open(client: Client, path: &Path) -> Handle {
        let file = client.open(path);
        if client != Client::Mapped {
            return Handle::Fd(file);
        }
        let map = Mapping::map(&file, 0, LEN as usize, Access::ReadWrite, Sharing::Shared);
        Handle::Mapped(map.expect("mmap(MAP_SHARED) of the mount"), file)
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match self {
            Handle::Fd(file) => file
                .write_all_at(data, offset)
                .expect("write through the mount"),
            Handle::Mapped(map, _) => map.write(offset as usize, data),
        }
    }

    /// The first batch's sync: fdatasync(2), or msync(MS_SYNC) of a mapping.
    fn sync_data(&self) {
        match self {
            Handle::Fd(file) => file.sync_data().expect("fdatasync through the mount"),
            Handle::Mapped(map, _) => map.sync_all().expect("msync through the mount"),
        }
    }

    /// The second batch's: fsync(2), which also writes a mapping's dirty pages back.
    fn sync_all(&self) {
        let (Handle::Fd(file) | Handle::Mapped(_, file)) = self;
        file.sync_all().expect("fsync through the mount");
    }
}

/// Writes chunk after chunk of the second half through its own fd, never syncing, until
/// a write fails (the daemon is gone); counts the writes that returned.
fn unsynced_writer(mount: &Path, client: Client, done: &AtomicU64) {
    let file = client.open(mount);
    for i in 0.. {
        let offset = HALF + i % (HALF / CHUNK) * CHUNK;
        let data = AlignedBuf::from_slice(&pattern(1000 + i, offset, CHUNK as usize));
        if file.write_all_at(&data, offset).is_err() {
            return;
        }
        done.store(i + 1, SeqCst);
    }
}

/// The test: see the module docs. `daemon_args` are `-w`, plus `--direct` if asked.
fn synced_writes_survive_sigkill(mode: Dispatch, client: Client, direct_daemon: bool) {
    if client == Client::Mapped {
        require_kernel!(
            6,
            6,
            "mmap(MAP_SHARED) of the export (FUSE_DIRECT_IO_ALLOW_MMAP)"
        );
    }
    let sandbox = match direct_daemon {
        true => match Sandbox::on_real_fs() {
            Ok(sandbox) => sandbox,
            Err(why) => return report_skip(&why),
        },
        false => Sandbox::new(),
    };
    let before = pattern(1, 0, LEN as usize);
    let image = sandbox.file("disk.img", &before);
    let args: &[&str] = if direct_daemon {
        &["-w", "--direct"]
    } else {
        &["-w"]
    };
    let mut export = MountedExport::start(&image, &sandbox.mountpoint("mnt"), mode, args);

    let unsynced = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let (mount, counter) = (export.path().to_owned(), Arc::clone(&unsynced));
    // Not scoped: if the I/O hangs, the test fails instead of hanging with it.
    std::thread::spawn(move || {
        unsynced_writer(&mount, client, &counter);
        let _ = tx.send(());
    });
    wait_for_progress(&unsynced, 3, "no progress of the unsynced writer");

    let handle = Handle::open(client, export.path());
    let mut want = before[..HALF as usize].to_vec();
    for (batch, writes) in client.writes().into_iter().enumerate() {
        for (i, &(offset, len)) in writes.iter().enumerate() {
            let (seed, len) = (100 * batch as u64 + i as u64, len as usize);
            let data = AlignedBuf::from_slice(&pattern(seed, offset, len));
            handle.write(offset, &data);
            want[offset as usize..][..len].copy_from_slice(&data);
        }
        match batch {
            0 => handle.sync_data(),
            _ => handle.sync_all(),
        }
    }
    export.crash();
    drop(handle);
    rx.recv_timeout(TIMEOUT)
        .expect("the unsynced writer stops when the daemon dies");

    export.umount_after_crash();
    let on_disk = fs::read(&image).unwrap();
    assert_eq!(on_disk.len() as u64, LEN, "the image changed size");
    assert_bytes_eq(
        &on_disk[..HALF as usize],
        &want,
        "synced half after SIGKILL",
    );
}

dispatch_tests!(mount_crash_buffered_writes_survive_sigkill);
fn mount_crash_buffered_writes_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Buffered, false);
}

dispatch_tests!(mount_crash_direct_writes_survive_sigkill);
fn mount_crash_direct_writes_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Direct, false);
}

dispatch_tests!(mount_crash_buffered_writes_to_a_direct_daemon_survive_sigkill);
fn mount_crash_buffered_writes_to_a_direct_daemon_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Buffered, true);
}

dispatch_tests!(mount_crash_direct_writes_to_a_direct_daemon_survive_sigkill);
fn mount_crash_direct_writes_to_a_direct_daemon_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Direct, true);
}

dispatch_tests!(mount_crash_mapped_writes_survive_sigkill);
fn mount_crash_mapped_writes_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Mapped, false);
}

dispatch_tests!(mount_crash_mapped_writes_to_a_direct_daemon_survive_sigkill);
fn mount_crash_mapped_writes_to_a_direct_daemon_survive_sigkill(mode: Dispatch) {
    synced_writes_survive_sigkill(mode, Client::Mapped, true);
}
