//! The directory export makes a caller's changes with the caller's credentials (fsuid,
//! fsgid, supplementary groups): a node is born the caller's (no chown after, so a
//! watcher of the source sees no attribute change), a directory writable through a
//! supplementary group is writable through the mount, set-group-ID directories give
//! their group as on the source, and an ACL set by a non-member clears set-group-ID. User `nobody` makes each change through the
//! `unprivileged` helper on the source and through a root daemon's `--allow-other` mount;
//! the outcomes and what they leave must be the same.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use corofuse_tests::{dispatch_tests, Dispatch, MountedExport};

const NOBODY: u32 = 65534;
/// A group nobody is given as a supplementary one.
const TEAM: u32 = 4242;

/// `unprivileged NOBODY NOBODY OP PATH` with supplementary `groups`: its line.
fn as_nobody(groups: &str, op: &str, path: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_unprivileged"))
        .env("UNPRIVILEGED_GROUPS", groups)
        .args([NOBODY.to_string(), NOBODY.to_string(), op.to_string()])
        .arg(path)
        .output()
        .expect("run unprivileged");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Owner, group and mode of `path`, or `missing`.
fn describe(path: &Path) -> String {
    match fs::symlink_metadata(path) {
        Ok(m) => format!("{}:{} {:o}", m.uid(), m.gid(), m.mode()),
        Err(_) => "missing".into(),
    }
}

/// A directory `name` in `root` owned by root:`gid` with `mode`.
fn dir(root: &Path, name: &str, gid: u32, mode: u32) {
    let path = root.join(name);
    fs::create_dir(&path).unwrap();
    std::os::unix::fs::chown(&path, Some(0), Some(gid)).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree for the cases: `open` (0777), `team` (root:TEAM 0770), `team-sgid` (2770),
/// and `open/sgid-file`, nobody's, in group root, set-group-ID.
fn tree(root: &Path) {
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    dir(root, "open", 0, 0o777);
    dir(root, "team", TEAM, 0o770);
    dir(root, "team-sgid", TEAM, 0o2770);
    let file = root.join("open/sgid-file");
    fs::write(&file, b"x").unwrap();
    std::os::unix::fs::chown(&file, Some(NOBODY), Some(0)).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o2775)).unwrap();
}

/// inotify on `dir`: the names that got IN_ATTRIB since it was set up.
struct Watch(OwnedFd);

impl Watch {
    fn new(dir: &Path) -> Watch {
        // SAFETY: inotify_init1 takes flags and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the path is NUL-terminated and outlives the call.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), libc::IN_ATTRIB) };
        assert!(wd >= 0);
        Watch(fd)
    }

    /// Names with an IN_ATTRIB event so far.
    fn attrib(&self) -> Vec<String> {
        let mut buf = [0u8; 4096];
        // SAFETY: reads at most 4096 bytes into a live buffer of that size.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let mut names = Vec::new();
        let mut at = 0;
        while n > 0 && at + 16 <= n as usize {
            let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
            let name = &buf[at + 16..at + 16 + len];
            let name = name.split(|&b| b == 0).next().unwrap_or(&[]);
            names.push(String::from_utf8_lossy(name).into_owned());
            at += 16 + len;
        }
        names
    }
}

dispatch_tests!(mount_dir_changes_are_made_as_the_caller[coroutine, threads, uring]);
fn mount_dir_changes_are_made_as_the_caller(mode: Dispatch) {
    let (src, direct) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    tree(src.path());
    tree(direct.path());
    let mnt = tempfile::tempdir().unwrap();
    fs::set_permissions(mnt.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let export = MountedExport::start_dir(src.path(), mnt.path(), mode, &["--allow-other"]);
    let team = TEAM.to_string();
    let cases: [(&str, &str, &str); 8] = [
        ("", "create", "open/f"),
        ("", "mkdir", "open/d"),
        (&team, "create", "team/f"),
        (&team, "mkdir", "team/d"),
        ("", "create", "team/refused"),
        (&team, "create", "team-sgid/f"),
        (&team, "mkdir", "team-sgid/d"),
        // An ACL set by the owner outside the file's group clears set-group-ID.
        ("", "setacl", "open/sgid-file"),
    ];
    let watch = Watch::new(&src.path().join("open"));
    let mut mismatches = Vec::new();
    for (groups, op, name) in cases {
        let on_source = as_nobody(groups, op, &direct.path().join(name));
        let through = as_nobody(groups, op, &export.path().join(name));
        let (left_source, left_mount) = (
            describe(&direct.path().join(name)),
            describe(&src.path().join(name)),
        );
        if (&on_source, &left_source) != (&through, &left_mount) {
            mismatches.push(format!(
                "{op} {name} (groups {groups:?}): source {on_source} {left_source}, mount {through} {left_mount}"
            ));
        }
    }
    assert!(mismatches.is_empty(), "{mode}:\n{}", mismatches.join("\n"));
    assert_eq!(describe(&src.path().join("open/f")), "65534:65534 100644");
    assert_eq!(
        describe(&src.path().join("open/sgid-file")),
        "65534:0 100755"
    );
    assert_eq!(
        describe(&src.path().join("team-sgid/d")).split(' ').next(),
        Some("65534:4242")
    );
    let attrib = watch.attrib();
    assert!(
        !attrib.iter().any(|n| n == "f" || n == "d"),
        "{mode}: born the caller's, never chowned: IN_ATTRIB on {attrib:?}"
    );
    export.stop();
}
