//! Several processes change one tree through `corofuse mount-dir` at once (creates,
//! appends, renames of files and of directories, unlinks, hard links, mkdirs, rmdirs,
//! stats, listings: the `tree-stress` worker), then the tree is checked: what the mount
//! lists is what the source holds, name by name, with the same type, size, inode number
//! and link count; the workers saw no errors but the races' own (ENOENT, EEXIST,
//! ENOTEMPTY); the daemon still serves and counts (`--stats` on SIGUSR1); and `corofuse
//! umount` ends it cleanly (exit status 0, no mount left).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use corofuse_tests::export::{read_stats, umount, TIMEOUT};
use corofuse_tests::require::note;
use corofuse_tests::tool::run_bounded;
use corofuse_tests::{dispatch_tests, Dispatch, MountedExport, Sandbox, Seed};

/// Worker processes, and how long each runs.
const WORKERS: u64 = 4;
const MILLIS: u64 = 3000;

/// Each name under `root` with its type, size (files only: a directory's size is the
/// source file system's business, and the same number either way), inode number and
/// link count.
fn tree(root: &Path) -> BTreeMap<String, (char, u64, u64, u64)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let (kind, size) = if meta.is_dir() {
                todo.push(path);
                ('d', 0)
            } else {
                ('f', meta.len())
            };
            out.insert(name, (kind, size, meta.ino(), meta.nlink()));
        }
    }
    out
}

fn counter(stats: &serde_json::Value, section: &str, name: &str) -> u64 {
    stats[section][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{section}.{name} in {stats}"))
}

dispatch_tests!(mount_dir_survives_concurrent_tree_changes[coroutine, threads]);
fn mount_dir_survives_concurrent_tree_changes(mode: Dispatch) {
    let seed = Seed::choose();
    let sandbox = Sandbox::new();
    let source = sandbox.path("source");
    fs::create_dir(&source).unwrap();
    for d in 0..4 {
        fs::create_dir(source.join(format!("d{d}"))).unwrap();
    }
    let mnt = sandbox.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let stats = sandbox.path("stats.json");
    let args = ["--stats", stats.to_str().unwrap()];
    let mut export = MountedExport::start_dir(&source, &mnt, mode, &args);
    let root = export.path().to_path_buf();
    let outputs: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let root = &root;
                let seed = seed.value().wrapping_add(w);
                s.spawn(move || {
                    let mut worker = Command::new(env!("CARGO_BIN_EXE_tree-stress"));
                    worker
                        .arg(root)
                        .arg(seed.to_string())
                        .arg(MILLIS.to_string());
                    let limit = Duration::from_millis(MILLIS) + TIMEOUT;
                    let ran = run_bounded(&mut worker, limit).unwrap_or_else(|e| panic!("{e}"));
                    assert!(ran.status.success(), "worker {w}: {}", ran.describe());
                    ran.stdout
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut ops = 0;
    for out in &outputs {
        let line = out.lines().next().unwrap_or_default();
        note(&format!("tree-stress ({mode}): {line}"));
        let n: u64 = line
            .split(' ')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        ops += n;
    }
    assert!(ops >= 100 * WORKERS, "only {ops} operations: {outputs:?}");

    let listed = tree(&root);
    let held = tree(&source);
    assert!(!held.is_empty(), "the stress left nothing at all");
    note(&format!(
        "tree-stress ({mode}): {ops} operations; {} names checked",
        held.len()
    ));
    let differ: Vec<_> = held
        .keys()
        .chain(listed.keys())
        .filter(|name| held.get(*name) != listed.get(*name))
        .map(|name| {
            format!(
                "{name}: source {:?}, mount {:?}",
                held.get(name),
                listed.get(name)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the mount and the source differ ({} names):\n{}",
        differ.len(),
        differ.join("\n")
    );

    export.signal(libc::SIGUSR1);
    let snapshot = read_stats(&stats);
    assert!(export.try_status().is_none(), "SIGUSR1 ended the daemon");
    let requests = counter(&snapshot, "queue", "requests");
    assert!(
        requests >= ops,
        "{requests} requests for {ops} operations: {snapshot}"
    );
    for (section, name) in [("runtime", "panicked"), ("queue", "malformed")] {
        assert_eq!(
            counter(&snapshot, section, name),
            0,
            "{section}.{name}: {snapshot}"
        );
    }
    assert!(
        fs::metadata(root.join("d0")).unwrap().is_dir(),
        "still serving"
    );

    let run = umount(&root);
    assert!(run.status.success(), "corofuse umount: {}", run.stderr);
    let status = export
        .wait_exit(TIMEOUT)
        .expect("the daemon exits after umount");
    assert!(status.success(), "{status}; stderr:\n{}", export.stderr());
    export.assert_unmounted();
    assert_eq!(tree(&source), held, "the source after the unmount");
}
