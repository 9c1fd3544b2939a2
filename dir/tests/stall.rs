//! A stalled metadata call holds back nothing else on its loop: on a FUSE source (here the
//! in-memory example of the server crate, mounted, stalling the LOOKUP of one name and
//! the MKDIR of another) the directory export runs metadata calls off the loop
//! (`MetadataPolicy::Auto`): LOOKUP's path walk through the ring (`IORING_OP_OPENAT2`),
//! MKDIR on a helper thread. While either waits, a lookup, an open and a read of another
//! file on the same single loop are answered.
//!
//! Root and /dev/fuse needed (skips visibly, a failure under COROFUSE_TEST_NO_SKIP=1).

#[path = "../../server/examples/memfs/fs.rs"]
#[allow(dead_code)]
mod memfs;

use std::fs;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dir_export::{DirFs, DirOptions};
use fuse::init::{InitConfig, Negotiated};
use fuse::{Operation, Reply, Request};
use memfs::MemFs;
use runtime::Ctx;
use server::{Background, Dispatch, ServeOptions, Target};
use transport::{FileSystem, Operations};

/// How long the stalled lookup takes.
const STALL: Duration = Duration::from_secs(3);

/// The in-memory tree, with the LOOKUP of `slow` stalled for [`STALL`].
struct SlowSource {
    fs: MemFs,
    /// Stall from now on (not while the test makes the files: creating `slow` looks it
    /// up first).
    armed: AtomicBool,
    stalled: AtomicBool,
    done: AtomicBool,
}

impl Operations for SlowSource {
    type Scratch = memfs::Scratch;
}

/// Serves through the tree's own [`FileSystem::handle`], stalling first where armed.
impl FileSystem for SlowSource {
    fn init_config(&self, config: InitConfig) -> InitConfig {
        self.fs.init_config(config)
    }

    fn session_started(&self, negotiated: &Negotiated, session: std::os::fd::BorrowedFd<'_>) {
        self.fs.session_started(negotiated, session)
    }

    fn handle<'b>(
        &self,
        cx: &Ctx<'_>,
        req: &Request<'_>,
        scratch: &'b mut Self::Scratch,
        data: &'b mut [u8],
    ) -> Option<Reply<'b>> {
        let slow = self.armed.load(Ordering::SeqCst)
            && match req.op {
                Operation::Lookup { name } => name.to_bytes() == b"slow",
                Operation::Mkdir { name, .. } => name.to_bytes() == b"slow-dir",
                _ => false,
            };
        if slow {
            self.stalled.store(true, Ordering::SeqCst);
            std::thread::sleep(STALL); // a worker thread of this source: nothing else waits
        }
        let reply = self.fs.handle(cx, req, scratch, data);
        if slow {
            self.done.store(true, Ordering::SeqCst);
        }
        reply
    }

    fn flush(&self, cx: &Ctx<'_>) -> std::io::Result<()> {
        self.fs.flush(cx)
    }

    fn describe(&self) -> String {
        "a slow in-memory source".into()
    }
}

fn target(mountpoint: &Path, name: &str) -> Target {
    Target {
        mountpoint: mountpoint.to_path_buf(),
        name: name.into(),
        directory: true,
        read_only: false,
    }
}

#[test]
fn a_stalled_lookup_holds_back_no_other_request_on_its_loop() {
    stalled_call_holds_back_nothing(|mnt| fs::read(mnt.join("slow")).map(drop));
}

#[test]
fn a_stalled_mkdir_holds_back_no_other_request_on_its_loop() {
    stalled_call_holds_back_nothing(|mnt| fs::create_dir(mnt.join("slow-dir")));
}

/// Mounts the slow source and the export over it (one coroutine loop), starts `stall`
/// (a call the source stalls) on another thread, and reads another file meanwhile.
fn stalled_call_holds_back_nothing(stall: fn(&Path) -> std::io::Result<()>) {
    corofuse_tests::require_fuse!();
    let (source_mnt, mnt) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = Arc::new(SlowSource {
        fs: MemFs::new(1 << 20, 0, 0),
        armed: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
        done: AtomicBool::new(false),
    });
    let threads = ServeOptions {
        dispatch: Dispatch::Threads(4),
        ..ServeOptions::default()
    };
    let slow_source = Background::start(
        Arc::clone(&source),
        &target(source_mnt.path(), "slow"),
        &threads,
    )
    .expect("mount the source");
    // The other file is in a directory of its own: a MKDIR holds its parent directory's
    // lock in the kernel, on the mount as on the source, whoever serves it.
    fs::create_dir(source_mnt.path().join("b")).unwrap();
    fs::write(source_mnt.path().join("b/fast"), b"fast data").unwrap();
    fs::write(source_mnt.path().join("slow"), b"slow data").unwrap();

    let export = DirFs::new(source_mnt.path(), DirOptions::default()).expect("the export");
    let one_loop = ServeOptions {
        queues: Some(1),
        ..ServeOptions::default()
    };
    let mounted = Background::start(Arc::new(export), &target(mnt.path(), "export"), &one_loop)
        .expect("mount the export");
    // Forget every cached name, on both mounts, but `b`, held open: each lookup below
    // reaches the source.
    let b = fs::File::open(mnt.path().join("b")).unwrap();
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    source.armed.store(true, Ordering::SeqCst);

    let mnt_path = mnt.path().to_path_buf();
    let slow = std::thread::spawn(move || stall(&mnt_path));
    while !source.stalled.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The export's only loop has a LOOKUP stalled on the source; another name's LOOKUP,
    // its OPEN and READ are answered while it waits.
    let fast = format!("/proc/self/fd/{}/fast", b.as_raw_fd());
    assert_eq!(fs::read(fast).unwrap(), b"fast data");
    assert!(
        !source.done.load(Ordering::SeqCst),
        "the other file was served only after the stalled call ended"
    );
    slow.join().unwrap().expect("the stalled call ends well");
    assert_eq!(mounted.finish().result.map_err(|e| e.to_string()), Ok(()));
    assert_eq!(
        slow_source.finish().result.map_err(|e| e.to_string()),
        Ok(())
    );
}
