//! The `memfs` example's file system (examples/memfs/fs.rs, included here) mounted for real
//! with every dispatch and transport the `server` crate has: coroutine loops (the default:
//! one per CPU, adaptive placement), one coroutine loop, inline, two worker threads, and
//! FUSE over io_uring. Each case creates, writes, reads back, truncates, renames, links,
//! lists, unlinks and removes through `std::fs`, checks STATFS and that every node removed
//! is freed once the kernel forgets it, then stops the server: it must end cleanly, having
//! served requests, with one report per loop, and the mount gone.
//!
//! Skips visibly without root or /dev/fuse (a failure with `COROFUSE_TEST_NO_SKIP=1`, as
//! `.ci/run` sets it). The io_uring case turns the fuse module's `enable_uring` on for its
//! run (restored when it ends), and skips, saying why, where the kernel has no such switch;
//! where it has one, a mount that does not get FUSE over io_uring fails the test.

#[path = "../examples/memfs/fs.rs"]
mod memfs;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use corofuse_tests::mountinfo::fuse_mounts_at;
use corofuse_tests::require::report_skip;
use corofuse_tests::uring::EnableUring;
use corofuse_tests::{errno_of, pattern, require_fuse};
use memfs::{MemFs, MAX_NODES};
use server::{Background, Dispatch, ServeOptions, Target, Transport};

/// What the files may hold together.
const CAPACITY: u64 = 64 << 20;

/// The default: a coroutine loop per CPU (at most 8), pinned, the adaptive placement
/// choosing which take requests.
#[test]
fn memfs_coroutine_loops() {
    mount_and_check(ServeOptions::default());
}

#[test]
fn memfs_one_coroutine_loop() {
    mount_and_check(ServeOptions {
        queues: Some(1),
        ..ServeOptions::default()
    });
}

#[test]
fn memfs_inline() {
    mount_and_check(ServeOptions {
        dispatch: Dispatch::Inline,
        ..ServeOptions::default()
    });
}

#[test]
fn memfs_threads() {
    mount_and_check(ServeOptions {
        dispatch: Dispatch::Threads(2),
        ..ServeOptions::default()
    });
}

/// FUSE over io_uring: `Transport::Uring` fails the mount unless INIT grants it.
#[test]
fn memfs_uring() {
    require_fuse!();
    let _on = match EnableUring::acquire() {
        Ok(on) => on,
        Err(why) => return report_skip(&format!("--transport uring: {why}")),
    };
    mount_and_check(ServeOptions {
        transport: Transport::Uring,
        ..ServeOptions::default()
    });
}

/// Mounts a new [`MemFs`] on a temporary directory as `options` say, runs [`exercise`]
/// through the mount, then stops serving (the [`Background`] guard unmounts on every
/// path, a failed assertion's too).
fn mount_and_check(options: ServeOptions) {
    require_fuse!();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mountpoint = dir.path().canonicalize().expect("canonical mount point");
    let owner = fs::metadata(&mountpoint).expect("mount point");
    let target = Target {
        mountpoint: mountpoint.clone(),
        name: "memfs".into(),
        directory: true,
        read_only: false,
    };
    let memfs = Arc::new(MemFs::new(CAPACITY, owner.uid(), owner.gid()));
    let mounted = Background::start(memfs, &target, &options).expect("mount");
    assert_eq!(fuse_mounts_at(&mountpoint), 1, "mounted");
    exercise(mounted.path(), mounted.fs());

    let served = mounted.finish();
    assert_eq!(
        served.result.map_err(|e| e.to_string()),
        Ok(()),
        "serving ends cleanly"
    );
    let report = &served.report;
    assert!(report.queue.requests > 0, "{:?}", report.queue);
    let loops = match options.dispatch {
        Dispatch::Threads(_) => 0, // the workers report no loops
        _ => options.plan_loops(allowed_cpus()).0,
    };
    assert_eq!(report.per_queue.len(), loops, "one report per loop");
    assert_eq!(fuse_mounts_at(&mountpoint), 0, "unmounted");
    assert_eq!(
        fs::read_dir(&mountpoint).unwrap().count(),
        0,
        "the empty mount point"
    );
}

fn allowed_cpus() -> Vec<usize> {
    runtime::affinity::allowed_cpus().expect("sched_getaffinity")
}

/// Everything the example supports, through the mount at `m`, checked with `std::fs`.
fn exercise(m: &Path, memfs: &MemFs) {
    let at = |name: &str| m.join(name);
    let errno = |result: io::Result<()>, what: &str| errno_of(result, what);

    // Directories and a file of a few hundred KiB: several READs and WRITEs.
    fs::create_dir_all(at("a/b")).unwrap();
    assert!(fs::metadata(at("a/b")).unwrap().is_dir());
    assert_eq!(
        fs::metadata(at("a")).unwrap().nlink(),
        3,
        "`.`, its name, b's `..`"
    );
    let data = pattern(7, 0, 300_000);
    fs::write(at("a/b/f"), &data).unwrap();
    assert_eq!(fs::read(at("a/b/f")).unwrap(), data);
    assert_eq!(fs::metadata(at("a/b/f")).unwrap().len(), 300_000);
    assert_eq!(
        memfs.usage(),
        (4, 300_000),
        "root, a, b, f; the bytes are in memory"
    );
    check_statfs(m, memfs);

    // A write past the end leaves a hole of zeros; an append goes at the end.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(at("a/b/f"))
        .unwrap();
    file.write_all_at(b"tail", 400_000).unwrap();
    let mut appending = OpenOptions::new().append(true).open(at("a/b/f")).unwrap();
    appending.write_all(b"more").unwrap();
    drop(appending);
    let grown = fs::read(at("a/b/f")).unwrap();
    assert_eq!(grown.len(), 400_008);
    assert_eq!(grown[..300_000], data[..]);
    assert!(grown[300_000..400_000].iter().all(|&b| b == 0), "a hole");
    assert_eq!(&grown[400_000..], b"tailmore");

    // Truncate down, then up: the regrown part reads as zeros.
    file.set_len(1000).unwrap();
    file.set_len(5000).unwrap();
    let mut back = vec![0xFF; 6000];
    let n = file.read_at(&mut back, 0).unwrap();
    assert_eq!(n, 5000, "a read stops at the end");
    assert_eq!(back[..1000], data[..1000]);
    assert!(back[1000..5000].iter().all(|&b| b == 0));
    drop(file);

    // Mode and times (SETATTR).
    fs::set_permissions(at("a/b/f"), fs::Permissions::from_mode(0o640)).unwrap();
    let when = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    File::options()
        .write(true)
        .open(at("a/b/f"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    let meta = fs::metadata(at("a/b/f")).unwrap();
    assert_eq!(meta.mode(), libc::S_IFREG | 0o640);
    assert_eq!(meta.modified().unwrap(), when);

    // Renames: in a directory, to another, over a file, a directory; refused ones.
    fs::rename(at("a/b/f"), at("a/b/g")).unwrap();
    fs::rename(at("a/b/g"), at("a/g")).unwrap();
    fs::write(at("a/h"), b"replaced").unwrap();
    fs::rename(at("a/g"), at("a/h")).unwrap();
    assert_eq!(fs::read(at("a/h")).unwrap()[..1000], data[..1000]);
    assert_eq!(
        errno(fs::metadata(at("a/g")).map(drop), "stat a/g"),
        libc::ENOENT
    );
    fs::write(at("a/i"), b"i").unwrap();
    let noreplace = corofuse_tests::sys::renameat2(&at("a/i"), &at("a/h"), libc::RENAME_NOREPLACE);
    assert_eq!(errno(noreplace, "rename NOREPLACE over a/h"), libc::EEXIST);
    fs::rename(at("a/b"), at("a/c")).unwrap();
    assert_eq!(
        errno(fs::rename(at("a"), at("a/c/x")), "a under itself"),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs::rename(at("a/i"), at("a/c")), "a file over a directory"),
        libc::EISDIR
    );

    // Links and symlinks.
    fs::hard_link(at("a/h"), at("a/h2")).unwrap();
    assert_eq!(fs::metadata(at("a/h")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("h", at("a/s")).unwrap();
    assert_eq!(fs::read_link(at("a/s")).unwrap(), PathBuf::from("h"));
    assert_eq!(fs::read(at("a/s")).unwrap().len(), 5000, "through the link");

    // Listing.
    assert_eq!(names(&at("a")), ["c", "h", "h2", "i", "s"]);

    // Enough entries for several READDIRs, removed while the listing is read.
    fs::create_dir(at("many")).unwrap();
    for i in 0..300 {
        fs::write(
            at(&format!("many/entry-with-a-longish-name-{i:03}")),
            i.to_string(),
        )
        .unwrap();
    }
    assert_eq!(names(&at("many")).len(), 300);
    for entry in fs::read_dir(at("many")).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
    }
    assert!(
        names(&at("many")).is_empty(),
        "every entry listed, every one removed"
    );
    fs::remove_dir(at("many")).unwrap();

    // A file unlinked while open stays readable and writable until its last close.
    let open = OpenOptions::new()
        .read(true)
        .write(true)
        .open(at("a/h2"))
        .unwrap();
    fs::remove_file(at("a/h")).unwrap();
    fs::remove_file(at("a/h2")).unwrap();
    open.write_all_at(b"still here", 0).unwrap();
    let mut head = [0; 10];
    open.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(&head, b"still here");
    drop(open);

    // What is refused.
    assert_eq!(
        errno(fs::remove_dir(at("a")), "rmdir a (not empty)"),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs::create_dir(at("a")), "mkdir a again"),
        libc::EEXIST
    );
    assert_eq!(
        errno(File::open(at("nothing")).map(drop), "open a missing file"),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs::remove_file(at("a/c")), "unlink a directory"),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs::remove_dir(at("a/s")), "rmdir a symlink"),
        libc::ENOTDIR
    );
    let too_long = at(&"n".repeat(256));
    assert_eq!(
        errno(fs::write(too_long, b""), "a 256-byte name"),
        libc::ENAMETOOLONG
    );

    // Empty again.
    for file in ["a/i", "a/s"] {
        fs::remove_file(at(file)).unwrap();
    }
    fs::remove_dir(at("a/c")).unwrap();
    fs::remove_dir(at("a")).unwrap();
    assert!(names(m).is_empty());
    // Each removed node is freed once the kernel forgets it (its FORGET comes by itself).
    let started = Instant::now();
    while memfs.usage() != (1, 0) {
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_secs(10),
            "still held: {:?}",
            memfs.usage()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    check_statfs(m, memfs);
}

/// The names in directory `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// STATFS through statvfs(2): the block size and name limit, the
/// capacity, and the free blocks and nodes as the file system counts them. Asked again if
/// the counts changed meanwhile (nodes unlinked earlier die when the kernel forgets them).
fn check_statfs(m: &Path, memfs: &MemFs) {
    for _ in 0..100 {
        let before = memfs.usage();
        let fields = statfs(m);
        let (nodes, used) = memfs.usage();
        if (nodes, used) != before {
            continue;
        }
        let free = (CAPACITY - used) / 4096;
        let nodes = nodes as u64;
        let expected = [
            4096,
            CAPACITY / 4096,
            free,
            free,
            MAX_NODES,
            MAX_NODES - nodes,
            255,
        ];
        assert_eq!(
            fields, expected,
            "block size, blocks, free, available, nodes, free, name max"
        );
        return;
    }
    panic!("the file system's counts kept changing");
}

/// statvfs(2) on the mount: what `stat -f --format='%S %b %f %a %c %d %l'` prints. A
/// syscall, not a child process: a child forked while another test's mount is stopping
/// could block at exec closing its copy of a file on that mount (FLUSH to a server that no
/// longer reads), holding a copy of that mount's /dev/fuse descriptor too.
fn statfs(m: &Path) -> Vec<u64> {
    let path = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain old data, so all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and outlives the call; `st` is a valid out pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    assert_eq!(
        rc,
        0,
        "statvfs {}: {}",
        m.display(),
        std::io::Error::last_os_error()
    );
    [
        st.f_frsize,
        st.f_blocks,
        st.f_bfree,
        st.f_bavail,
        st.f_files,
        st.f_ffree,
        st.f_namemax,
    ]
    .to_vec()
}

/// `server::Exports`: two memfs mounts in one process; one is removed while the other
/// serves on, and the one left keeps its files; the mount of the removed one is gone when
/// `remove` returns.
#[test]
fn memfs_exports_added_and_removed_while_others_serve() {
    require_fuse!();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let owner = fs::metadata(dirs[0].path()).unwrap();
    let mut exports = server::Exports::default();
    for (i, dir) in dirs.iter().enumerate() {
        let target = Target {
            mountpoint: dir.path().to_path_buf(),
            name: format!("memfs{i}"),
            directory: true,
            read_only: false,
        };
        let fs = Arc::new(MemFs::new(CAPACITY, owner.uid(), owner.gid()));
        let options = ServeOptions {
            queues: Some(1),
            ..ServeOptions::default()
        };
        exports
            .add(&format!("e{i}"), fs, &target, &options)
            .expect("mount");
    }
    assert!(
        exports
            .add(
                "e0",
                Arc::new(MemFs::new(CAPACITY, 0, 0)),
                &Target {
                    mountpoint: dirs[0].path().to_path_buf(),
                    name: "dup".into(),
                    directory: true,
                    read_only: false,
                },
                &ServeOptions::default()
            )
            .is_err(),
        "ids are unique"
    );
    fs::write(dirs[0].path().join("a"), b"zero").unwrap();
    fs::write(dirs[1].path().join("b"), b"one").unwrap();
    let served = exports.remove("e0").expect("e0 is live");
    assert_eq!(served.result.map_err(|e| e.to_string()), Ok(()));
    assert_eq!(
        fuse_mounts_at(dirs[0].path()),
        0,
        "e0's mount is gone on return"
    );
    assert!(exports.remove("e0").is_none());
    assert_eq!(
        fs::read(dirs[1].path().join("b")).unwrap(),
        b"one",
        "e1 still serves"
    );
    fs::write(dirs[1].path().join("c"), b"two").unwrap();
    assert_eq!(exports.ids().collect::<Vec<_>>(), ["e1"]);
    for (id, served) in exports.stop_all() {
        assert_eq!(served.result.map_err(|e| e.to_string()), Ok(()), "{id}");
    }
    assert_eq!(fuse_mounts_at(dirs[1].path()), 0);
}

/// The threads of this process of the loop set named `shared` (`shared-N`). A listing
/// of /proc/self/task may miss a thread while the other tests' threads come and go: the
/// longest of a few listings.
fn loop_threads() -> Vec<String> {
    let list = || -> Vec<String> {
        fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .filter(|c| c.starts_with("shared-"))
            .collect()
    };
    (0..5).map(|_| list()).max_by_key(Vec::len).unwrap()
}

/// `server::Exports::add_on`: two memfs mounts served by one shared event loop, a third
/// added on the same loop and removed while the two serve; each export's statistics are
/// its own (requests made through one are not counted in another's), and the process has
/// one loop thread throughout.
#[test]
fn memfs_exports_share_one_loop() {
    require_fuse!();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let owner = fs::metadata(dirs[0].path()).unwrap();
    let set = Arc::new(server::LoopSet::named("shared"));
    let before = loop_threads().len();
    let on = set
        .add_loop(None, runtime::Config::default())
        .expect("a loop");
    let mut exports = server::Exports::with_loops(Arc::clone(&set));
    let add = |exports: &mut server::Exports<MemFs>, i: usize| {
        let target = Target {
            mountpoint: dirs[i].path().to_path_buf(),
            name: format!("memfs{i}"),
            directory: true,
            read_only: false,
        };
        let fs = Arc::new(MemFs::new(CAPACITY, owner.uid(), owner.gid()));
        let options = ServeOptions {
            accounting: true,
            ..ServeOptions::default()
        };
        exports.add_on(&format!("e{i}"), fs, &target, &options, &[on])
    };
    add(&mut exports, 0).expect("e0");
    add(&mut exports, 1).expect("e1");
    assert!(
        add(&mut exports, 2).is_ok() && fuse_mounts_at(dirs[2].path()) == 1,
        "e2 is added while e0 and e1 serve"
    );
    // A listing may miss a thread (see loop_threads): the count must be seen right.
    let one = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        loop_threads().len() == before + 1
    });
    assert!(one, "three exports, one loop thread: {:?}", loop_threads());
    for (i, dir) in dirs.iter().enumerate() {
        fs::write(dir.path().join("f"), format!("data {i}")).unwrap();
    }
    let quiet = exports.snapshot("e1").expect("e1 answers").queue.requests;
    for _ in 0..50 {
        assert_eq!(fs::read(dirs[0].path().join("f")).unwrap(), b"data 0");
        let _ = fs::metadata(dirs[0].path().join("missing"));
    }
    let e0 = exports.snapshot("e0").expect("e0 answers");
    let e1 = exports.snapshot("e1").expect("e1 answers");
    assert!(e0.queue.requests >= 50, "e0 counts its own: {:?}", e0.queue);
    assert_eq!(e1.queue.requests, quiet, "e1 counts none of e0's requests");
    assert!(e0.ops.contains_key("LOOKUP"), "e0's per-opcode accounting");
    assert_eq!(e0.per_queue.len(), 1, "one queue: the shared loop");

    let served = exports.remove("e2").expect("e2 is live");
    assert_eq!(served.result.map_err(|e| e.to_string()), Ok(()));
    assert_eq!(fuse_mounts_at(dirs[2].path()), 0, "e2's mount is gone");
    for (i, dir) in dirs[..2].iter().enumerate() {
        assert_eq!(
            fs::read(dir.path().join("f")).unwrap(),
            format!("data {i}").as_bytes(),
            "e{i} serves on after e2 left the loop"
        );
    }
    add(&mut exports, 2).expect("e2 again, on the same loop");
    assert_eq!(
        fs::read_dir(dirs[2].path()).unwrap().count(),
        0,
        "a new memfs"
    );
    for (id, served) in exports.stop_all() {
        assert_eq!(served.result.map_err(|e| e.to_string()), Ok(()), "{id}");
    }
    for dir in &dirs {
        assert_eq!(fuse_mounts_at(dir.path()), 0);
    }
    drop(exports);
    drop(set);
    let deadline = Instant::now() + Duration::from_secs(5);
    while loop_threads().len() > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(loop_threads().len(), before, "the loop ends with its set");
}
