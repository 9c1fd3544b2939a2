//! The node descriptor budget on a real tree: past the budget, cold nodes' descriptors
//! close and reopen from file handles, and every operation still reaches the right file.

use std::ffi::CString;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};

use dir_export::{Tree, ROOT};

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Whether this process may open file handles (root: CAP_DAC_READ_SEARCH); without them
/// every node keeps its descriptor and the budget is not enforced.
fn handles_work(t: &Tree) -> bool {
    t.inodes.descriptor_stats().file_handles
}

#[test]
fn past_the_budget_nodes_reopen_from_their_handles() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..200 {
        fs::write(dir.path().join(format!("f{i}")), format!("file {i}")).unwrap();
    }
    fs::create_dir(dir.path().join("sub")).unwrap();
    symlink("f7", dir.path().join("link")).unwrap();
    let t = Tree::new(dir.path(), false, 8).unwrap();
    if !handles_work(&t) {
        corofuse_tests::require::report_skip(
            "no file handles here (open_by_handle_at needs CAP_DAC_READ_SEARCH: run as root)",
        );
        return;
    }
    let entries: Vec<_> = (0..200)
        .map(|i| {
            t.lookup(&runtime::Ctx::Blocking, ROOT, &c(&format!("f{i}")))
                .unwrap()
        })
        .collect();
    let link = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("link")).unwrap();
    let sub = t.lookup(&runtime::Ctx::Blocking, ROOT, &c("sub")).unwrap();
    let stats = t.inodes.descriptor_stats();
    assert!(stats.closed >= 190, "cold descriptors closed: {stats:?}");
    assert!(t.inodes.descriptors().open() <= 8, "{stats:?}");
    assert_eq!(t.inodes.len(), 203, "every node is still held");

    // Every node still names its own file, through a reopen.
    for (i, e) in entries.iter().enumerate() {
        let st = t.getattr(e.nodeid).unwrap();
        let meta = fs::metadata(dir.path().join(format!("f{i}"))).unwrap();
        assert_eq!(
            (st.st_ino, st.st_size as u64),
            (meta.ino(), meta.size()),
            "f{i}"
        );
    }
    let mut buf = [0u8; 16];
    let n = t.readlink(link.nodeid, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"f7", "a symlink reopens as the link itself");
    let made = t.mkdir(sub.nodeid, &c("deeper"), 0o755, 0).unwrap();
    assert!(dir.path().join("sub/deeper").is_dir(), "{made:?}");
    let reopened = t.inodes.descriptor_stats().reopened;
    assert!(reopened >= 190, "{:?}", t.inodes.descriptor_stats());
    assert!(t.inodes.descriptors().open() <= 8);

    // A node whose file is renamed elsewhere keeps it, closed or not.
    fs::rename(dir.path().join("f3"), dir.path().join("sub/moved")).unwrap();
    for e in &entries[100..] {
        t.getattr(e.nodeid).unwrap(); // f3's descriptor goes cold again
    }
    let st = t.getattr(entries[3].nodeid).unwrap();
    assert_eq!(
        st.st_ino,
        fs::metadata(dir.path().join("sub/moved")).unwrap().ino()
    );

    // A cold node whose file is deleted is stale, not another file.
    fs::remove_file(dir.path().join("f5")).unwrap();
    for e in &entries[100..] {
        t.getattr(e.nodeid).unwrap();
    }
    let gone = t.getattr(entries[5].nodeid).unwrap_err();
    assert_eq!(gone.raw_os_error(), Some(libc::ESTALE));

    // A hard link looked up while its node is cold is the same node, and revives it.
    fs::hard_link(dir.path().join("f9"), dir.path().join("again")).unwrap();
    let before = t.inodes.descriptor_stats().reopened;
    let again = t
        .lookup(&runtime::Ctx::Blocking, ROOT, &c("again"))
        .unwrap();
    assert_eq!(again.nodeid, entries[9].nodeid);
    t.getattr(again.nodeid).unwrap();
    let stats = t.inodes.descriptor_stats();
    assert_eq!(stats.reopened, before, "revived by the lookup");
    assert_eq!(stats.revived, 1, "{stats:?}");
}

#[test]
fn nodes_within_the_budget_are_never_closed() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..50 {
        fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
    }
    let t = Tree::new(dir.path(), false, 64).unwrap();
    let entries: Vec<_> = (0..50)
        .map(|i| {
            t.lookup(&runtime::Ctx::Blocking, ROOT, &c(&format!("f{i}")))
                .unwrap()
        })
        .collect();
    for e in &entries {
        t.getattr(e.nodeid).unwrap();
    }
    let stats = t.inodes.descriptor_stats();
    assert_eq!((stats.closed, stats.reopened), (0, 0), "{stats:?}");
}
