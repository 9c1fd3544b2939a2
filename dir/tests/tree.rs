//! The inode table and directory streams on a real tree in a temporary directory.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::symlink;

use dir_export::{DirStream, Inodes, ROOT};

fn name(s: &str) -> CString {
    CString::new(s).unwrap()
}

#[test]
fn lookups_count_and_hard_links_are_one_node() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a"), b"x").unwrap();
    fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();
    symlink("a", dir.path().join("link")).unwrap();
    let inodes = Inodes::new(dir.path(), 1 << 16).unwrap();
    let root = inodes.get(ROOT).expect("the root");
    assert!(root.is_dir());

    let a = inodes.lookup(ROOT, &root, &name("a")).unwrap();
    let again = inodes.lookup(ROOT, &root, &name("a")).unwrap();
    let b = inodes.lookup(ROOT, &root, &name("b")).unwrap();
    assert_eq!(
        (a.nodeid, again.nodeid),
        (b.nodeid, b.nodeid),
        "one node per file"
    );
    assert_eq!(inodes.lookups(a.nodeid), 3);
    assert_eq!(b.attr.st_nlink, 2);
    assert_eq!(inodes.len(), 2, "root and the file");

    let link = inodes.lookup(ROOT, &root, &name("link")).unwrap();
    assert_eq!(
        link.attr.st_mode & libc::S_IFMT,
        libc::S_IFLNK,
        "the link, not its target"
    );
    assert_ne!(link.nodeid, a.nodeid);

    // `..` of the root stays at the root; `.` is the directory itself.
    let up = inodes.lookup(ROOT, &root, &name("..")).unwrap();
    assert_eq!(up.nodeid, ROOT);
    let sub = inodes.lookup(ROOT, &root, &name("sub")).unwrap();
    let dot = inodes.lookup(sub.nodeid, &sub.inode, &name(".")).unwrap();
    assert_eq!(dot.nodeid, sub.nodeid);
    let parent = inodes.lookup(sub.nodeid, &sub.inode, &name("..")).unwrap();
    assert_eq!(parent.nodeid, ROOT);

    // Missing names and names with a slash are errors, not nodes.
    let missing = inodes.lookup(ROOT, &root, &name("nope")).unwrap_err();
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    let slash = inodes.lookup(ROOT, &root, &name("sub/x")).unwrap_err();
    assert_eq!(slash.raw_os_error(), Some(libc::EINVAL));

    // FORGET: the node goes at zero, not before; the root never goes.
    inodes.forget(a.nodeid, 2);
    assert!(inodes.get(a.nodeid).is_some());
    inodes.forget(a.nodeid, 1);
    assert!(inodes.get(a.nodeid).is_none(), "forgotten");
    inodes.forget(ROOT, 1000);
    assert!(inodes.get(ROOT).is_some());
    inodes.forget(a.nodeid, 1); // unknown or forgotten now: ignored
    let back = inodes.lookup(ROOT, &root, &name("b")).unwrap();
    assert_eq!(inodes.lookups(back.nodeid), 1, "a fresh lookup");
    if inodes.exportable() {
        // Kept for file handles: the same node, id and generation, found again.
        assert_eq!(
            (back.nodeid, back.inode.generation),
            (a.nodeid, a.inode.generation)
        );
    } else {
        assert_ne!(back.inode.generation, a.inode.generation, "a fresh node");
    }
}

#[test]
fn a_node_keeps_its_file_across_renames() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("d")).unwrap();
    fs::write(dir.path().join("d/f"), b"data").unwrap();
    let inodes = Inodes::new(dir.path(), 1 << 16).unwrap();
    let root = inodes.get(ROOT).unwrap();
    let d = inodes.lookup(ROOT, &root, &name("d")).unwrap();
    fs::rename(dir.path().join("d"), dir.path().join("moved")).unwrap();
    // The handle still names the directory: its child is found under the new path.
    let f = inodes.lookup(d.nodeid, &d.inode, &name("f")).unwrap();
    assert_eq!(f.attr.st_size, 4);
}

/// Lists `stream` in replies of at most `per_reply` entries, each continuing from the
/// last entry taken, as the kernel does; returns the names.
fn list(stream: &mut DirStream, per_reply: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let mut room = per_reply;
        let mut last = None;
        let taken = stream
            .read(offset, |e| {
                if room == 0 {
                    return false;
                }
                room -= 1;
                names.push(String::from_utf8(e.name.to_vec()).unwrap());
                last = Some(e.next);
                true
            })
            .unwrap();
        match last {
            Some(next) if taken > 0 => offset = next,
            _ => return names,
        }
    }
}

#[test]
fn a_listing_is_linear_however_it_is_split() {
    let dir = tempfile::tempdir().unwrap();
    let n = 5000;
    for i in 0..n {
        fs::write(
            dir.path().join(format!("file-with-a-longish-name-{i:05}")),
            b"",
        )
        .unwrap();
    }
    let inodes = Inodes::new(dir.path(), 1 << 16).unwrap();
    let root = inodes.get(ROOT).unwrap();
    for per_reply in [1, 37, 100_000] {
        let mut stream = DirStream::open(&root).unwrap();
        let names = list(&mut stream, per_reply);
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(
            names.len(),
            n + 2,
            "every entry plus . and .., {per_reply} per reply"
        );
        assert_eq!(unique.len(), names.len(), "no entry twice");
        assert!(unique.contains(&".".to_string()) && unique.contains(&"..".to_string()));
        let stats = stream.stats();
        // One getdents64 per batch of records, plus the one that finds the end, whatever
        // the reply size: no rescans, no seeks.
        let bytes = (n + 2) * 48;
        let batches = bytes.div_ceil(dir_export::dirstream::BATCH) as u64;
        assert!(
            stats.getdents <= batches + 2,
            "{per_reply} per reply: {stats:?} for ~{batches} batches"
        );
        assert_eq!(stats.seeks, 0, "{per_reply} per reply: {stats:?}");
    }
}

#[test]
fn rewinding_or_resuming_elsewhere_seeks() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..100 {
        fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
    }
    let inodes = Inodes::new(dir.path(), 1 << 16).unwrap();
    let root = inodes.get(ROOT).unwrap();
    let mut stream = DirStream::open(&root).unwrap();
    let mut first = Vec::new();
    stream
        .read(0, |e| {
            first.push((e.name.to_vec(), e.next));
            first.len() < 10
        })
        .unwrap();
    // The 10th entry was refused: it comes first when the listing continues from the 9th.
    let resume = first[8].1;
    let mut next = None;
    stream
        .read(resume, |e| {
            next = Some(e.name.to_vec());
            false
        })
        .unwrap();
    assert_eq!(next.as_deref(), Some(&first[9].0[..]));
    assert_eq!(stream.stats().seeks, 0, "continuing where it stands");
    // Back to an earlier cookie: a seek, and the listing resumes right after it.
    let mut after = None;
    stream
        .read(first[2].1, |e| {
            after = Some(e.name.to_vec());
            false
        })
        .unwrap();
    assert_eq!(after.as_deref(), Some(&first[3].0[..]));
    assert_eq!(stream.stats().seeks, 1);
    // And from the start again.
    let mut restart = None;
    stream
        .read(0, |e| {
            restart = Some(e.name.to_vec());
            false
        })
        .unwrap();
    assert_eq!(restart.as_deref(), Some(&first[0].0[..]));
}

/// Forgotten nodes and file handles (FUSE_EXPORT_SUPPORT): "." finds a forgotten node
/// under its id and generation, its descriptor closed meanwhile; a node whose file was
/// deleted goes for good; a new file that reuses a forgotten file's inode number gets a
/// node of its own.
#[test]
fn forgotten_nodes_come_back_by_dot_and_deleted_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("kept"), b"x").unwrap();
    fs::write(dir.path().join("gone"), b"y").unwrap();
    let inodes = Inodes::new(dir.path(), 1 << 16).unwrap();
    if !inodes.exportable() {
        corofuse_tests::require::report_skip(
            "no file handles here (not root, or the temporary directory's file system has none)",
        );
        return;
    }
    let root = inodes.get(ROOT).unwrap();
    let kept = inodes.lookup(ROOT, &root, &name("kept")).unwrap();
    let gone = inodes.lookup(ROOT, &root, &name("gone")).unwrap();
    inodes.forget(kept.nodeid, 1);
    inodes.forget(gone.nodeid, 1);
    assert!(
        inodes.get(kept.nodeid).is_none(),
        "forgotten: no request may use it"
    );
    assert_eq!((inodes.len(), inodes.forgotten()), (1, 2));

    let back = inodes.lookup_self(kept.nodeid).unwrap();
    assert_eq!(
        (back.nodeid, back.inode.generation),
        (kept.nodeid, kept.inode.generation)
    );
    assert_eq!(inodes.lookups(kept.nodeid), 1);
    assert_eq!((inodes.len(), inodes.forgotten()), (2, 1));

    fs::remove_file(dir.path().join("gone")).unwrap();
    let stale = inodes.lookup_self(gone.nodeid).unwrap_err();
    assert_eq!(stale.raw_os_error(), Some(libc::ESTALE));
    assert_eq!(
        (inodes.len(), inodes.forgotten()),
        (2, 0),
        "dropped for good"
    );

    // Deleted while held, then forgotten: not kept at all.
    let kept_again = inodes.lookup(ROOT, &root, &name("kept")).unwrap();
    assert_eq!(kept_again.nodeid, kept.nodeid);
    fs::remove_file(dir.path().join("kept")).unwrap();
    inodes.forget(kept.nodeid, 2);
    assert_eq!((inodes.len(), inodes.forgotten()), (1, 0));
}
