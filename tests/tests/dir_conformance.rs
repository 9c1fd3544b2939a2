//! The directory export behaves like its source (issue 32): what a broad file-system
//! suite found different on `mount-dir` over ext4, each checked here by doing the same
//! thing on the source and through the mount and comparing, on every transport and with
//! every `--passthrough` policy.
//!
//! - Privilege bits after a data change by the file's owner (in its group), a member by a
//!   supplementary group, another user and root: write, O_DIRECT write, truncate,
//!   `O_TRUNC`, every fallocate mode, copy_file_range; the bits left on the source and
//!   what `stat -c %A` (a statx asking for the mode alone) shows through the mount at
//!   once, attributes cached for 60 s.
//! - File handles of hard-linked files, taken before and after linking, the original
//!   name kept or unlinked, opened after the dentry cache is dropped.
//! - mtime and ctime after a write through a shared mapping: after msync, and after
//!   munmap and close, as `stat -c '%Y %Z'` shows them through the mount.
//! - msync of a shared mapping of an O_DIRECT file whose last page is partial (the
//!   operations xfstests' fsx `-Z` failed on: a file extended by ftruncate to a size that
//!   is not a multiple of 512, mapped, written up to its end, msynced).

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use corofuse_tests::{
    dispatch_tests, sys, Access, Dispatch, Mapping, MountedExport, Sandbox, Sharing,
};

/// Every `--passthrough` policy.
const POLICIES: [&str; 3] = ["auto", "always", "never"];

const NOBODY: u32 = 65534;

/// A source tree and its mount: `tree/direct` is worked on directly, `tree/mounted`
/// through `mnt/mounted`; every component is 0755 so that other users reach both.
struct Sides {
    _sandbox: Sandbox,
    tree: PathBuf,
    export: MountedExport,
}

impl Sides {
    fn mount(mode: Dispatch, policy: &str, extra: &[&str]) -> Sides {
        let sandbox = Sandbox::new();
        set_mode(sandbox.path("").as_path(), 0o755);
        let tree = open_dir(&sandbox.path("tree"));
        open_dir(&tree.join("direct"));
        open_dir(&tree.join("mounted"));
        let mnt = open_dir(&sandbox.path("mnt"));
        let mut args = vec!["--allow-other", "--passthrough", policy];
        args.extend_from_slice(extra);
        let export = MountedExport::start_dir(&tree, &mnt, mode, &args);
        Sides {
            _sandbox: sandbox,
            tree,
            export,
        }
    }

    /// `name` on the source, in the directory worked on directly.
    fn direct(&self, name: &str) -> PathBuf {
        self.tree.join("direct").join(name)
    }

    /// `name` on the source, in the directory worked on through the mount.
    fn backing(&self, name: &str) -> PathBuf {
        self.tree.join("mounted").join(name)
    }

    /// `name` through the mount.
    fn through(&self, name: &str) -> PathBuf {
        self.export.path().join("mounted").join(name)
    }

    fn stop(self) {
        self.export.stop();
    }
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn open_dir(path: &Path) -> PathBuf {
    fs::create_dir_all(path).unwrap();
    set_mode(path, 0o755);
    path.to_path_buf()
}

/// `statx` of `path` asking for `mask` alone, as `stat(1)` asks for what its format
/// shows (`%A`: the mode; `%Y %Z`: the times): the kernel answers from its attribute
/// cache unless what it invalidated is among what is asked.
fn statx(path: &Path, mask: u32) -> libc::statx {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statx is plain data; all-zero is valid and overwritten by the call.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and outlives the call, `stx` a writable statx.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, mask, &mut stx) };
    let e = std::io::Error::last_os_error();
    assert_eq!(rc, 0, "statx {}: {e}", path.display());
    stx
}

/// The mode bits as `stat -c %A` shows them.
fn mode_as_stat_shows(path: &Path) -> u32 {
    u32::from(statx(path, libc::STATX_MODE).stx_mode) & 0o7777
}

/// Who runs an operation: uid, gid, supplementary groups.
struct Who {
    name: &'static str,
    uid: u32,
    gid: u32,
    groups: &'static str,
}

/// Files are owned by nobody:nogroup (65534:65534).
const WHO: [Who; 4] = [
    Who {
        name: "owner",
        uid: NOBODY,
        gid: NOBODY,
        groups: "",
    },
    Who {
        name: "member by a supplementary group",
        uid: 4321,
        gid: 4321,
        groups: "65534",
    },
    Who {
        name: "another user",
        uid: 4321,
        gid: 4321,
        groups: "",
    },
    Who {
        name: "root",
        uid: 0,
        gid: 0,
        groups: "",
    },
];

/// `unprivileged UID GID OP ARGS...` (root stays root: it keeps its capabilities).
fn run_as(who: &Who, op: &str, args: &[&Path]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_unprivileged"))
        .args([who.uid.to_string(), who.gid.to_string(), op.to_string()])
        .args(args)
        .env("UNPRIVILEGED_GROUPS", who.groups)
        .output()
        .expect("run unprivileged");
    assert!(
        out.status.success(),
        "unprivileged {op} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The modes tried: both bits or set-group-ID alone, group-executable or not, writable
/// by all or by the owner only.
const MODES: [u32; 6] = [0o6666, 0o6676, 0o2666, 0o2676, 0o6644, 0o2644];

/// The data changes tried: an op of `unprivileged` and its literal arguments (`copy`
/// copies the 4 KiB file `data` into the file).
const CHANGES: [(&str, Option<&str>); 9] = [
    ("write", None),
    ("write-direct", None),
    ("truncate", Some("100")),
    ("open-trunc", None),
    ("fallocate", Some("alloc")),
    ("fallocate", Some("keep")),
    ("fallocate", Some("punch")),
    ("fallocate", Some("zero")),
    ("copy", None),
];

/// An 8 KiB file of nobody's with `mode`.
fn nobodys_file(path: &Path, mode: u32) {
    fs::write(path, vec![7u8; 8192]).unwrap();
    std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    set_mode(path, mode);
}

/// Runs a change (an entry of [`CHANGES`]) on `file` as `who`: its outcome line.
fn change(who: &Who, (op, lit): (&str, Option<&str>), file: &Path, data: &Path) -> String {
    let lit = lit.map(PathBuf::from);
    match (op, &lit) {
        ("copy", _) => run_as(who, op, &[data, file]),
        (_, Some(lit)) => run_as(who, op, &[file, lit]),
        _ => run_as(who, op, &[file]),
    }
}

dispatch_tests!(dir_conformance_privilege_bits_as_the_source);
/// Issue 32, items 2 and 3: after each data change by each kind of caller, the source
/// file of the mount keeps the bits the source keeps (set-group-ID without group execute
/// stays for a member of the file's group and for root), and `stat` through the mount
/// shows them at once, though the attributes were cached for 60 s just before.
fn dir_conformance_privilege_bits_as_the_source(mode: Dispatch) {
    for policy in POLICIES {
        let sides = Sides::mount(mode, policy, &["--timeout", "60"]);
        for dir in [sides.direct("data"), sides.backing("data")] {
            fs::write(&dir, vec![5u8; 4096]).unwrap();
            set_mode(&dir, 0o644);
        }
        let mut differ = Vec::new();
        let mut cases = 0;
        for (w, who) in WHO.iter().enumerate() {
            for bits in MODES {
                for (i, &what) in CHANGES.iter().enumerate() {
                    let name = format!("f{w}-{bits:o}-{i}");
                    nobodys_file(&sides.direct(&name), bits);
                    nobodys_file(&sides.backing(&name), bits);
                    let through = sides.through(&name);
                    assert_eq!(
                        mode_as_stat_shows(&through),
                        bits,
                        "{mode} {policy}: {name}"
                    );
                    let want = change(who, what, &sides.direct(&name), &sides.direct("data"));
                    let got = change(who, what, &through, &sides.through("data"));
                    let source = fs::metadata(sides.direct(&name)).unwrap().mode() & 0o7777;
                    let left = fs::metadata(sides.backing(&name)).unwrap().mode() & 0o7777;
                    let shown = mode_as_stat_shows(&through);
                    cases += 1;
                    if (&want, source) != (&got, left) || shown != left {
                        differ.push(format!(
                            "{} {:04o} {:?} {:?}: source {want} {source:04o}; mount {got} \
                             {left:04o}, stat shows {shown:04o}",
                            who.name, bits, what.0, what.1
                        ));
                    }
                }
            }
        }
        assert!(
            differ.is_empty(),
            "{mode} --passthrough {policy}: {} of {cases} cases differ:\n{}",
            differ.len(),
            differ.join("\n")
        );
        sides.stop();
    }
}

/// What opening each handle gives after the dentry cache is dropped: the content read,
/// or the errno.
fn open_all(root: &Path, handles: &[sys::FileHandle]) -> Vec<Result<String, i32>> {
    handles
        .iter()
        .map(|h| {
            sys::open_by_handle(root, h, libc::O_RDONLY).map(|mut f| {
                let mut text = String::new();
                f.read_to_string(&mut text).unwrap();
                text
            })
        })
        .collect()
}

/// Makes `files` files in `dir` (through the side given), takes their handles, links
/// each (in `dir`, then in `dir/other`) and takes the links' handles, unlinks the
/// original names if `unlink`, drops the dentry cache and opens every handle.
fn linked_handles(dir: &Path, root: &Path, unlink: bool) -> Vec<Result<String, i32>> {
    fs::create_dir_all(dir.join("other")).unwrap();
    let mut handles = Vec::new();
    for i in 0..8 {
        let file = dir.join(format!("file{i}"));
        fs::write(&file, format!("file {i}")).unwrap();
        handles.push(sys::file_handle(&file).expect("name_to_handle_at"));
        let (near, far) = (
            dir.join(format!("link{i}")),
            dir.join(format!("other/link{i}")),
        );
        fs::hard_link(&file, &near).unwrap();
        fs::hard_link(&file, &far).unwrap();
        handles.push(sys::file_handle(&near).expect("name_to_handle_at of a link"));
        if unlink {
            fs::remove_file(&file).unwrap();
        }
    }
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    open_all(root, &handles)
}

dispatch_tests!(dir_conformance_file_handles_of_linked_files);
/// Issue 32, item 4: handles of files with more than one link open after the kernel
/// dropped its dentries and inodes (and sent FORGET for them), as on the source: the
/// original name kept, or unlinked (the file lives on under its links).
fn dir_conformance_file_handles_of_linked_files(mode: Dispatch) {
    for policy in POLICIES {
        let sides = Sides::mount(mode, policy, &[]);
        for unlink in [false, true] {
            let case = format!("u{}", u8::from(unlink));
            let want = linked_handles(&sides.direct(&case), &sides.tree, unlink);
            let got = linked_handles(&sides.through(&case), sides.export.path(), unlink);
            assert!(want.iter().all(Result::is_ok), "{want:?}");
            assert_eq!(
                got, want,
                "{mode} --passthrough {policy}: originals unlinked {unlink}"
            );
        }
        sides.stop();
    }
}

/// mtime and ctime (seconds, nanoseconds each).
type Times = (i64, i64, i64, i64);

/// mtime and ctime, as `stat -c '%Y %Z'` asks for them.
fn times(path: &Path) -> Times {
    let stx = statx(path, libc::STATX_MTIME | libc::STATX_CTIME);
    let (m, c) = (stx.stx_mtime, stx.stx_ctime);
    (m.tv_sec, m.tv_nsec.into(), c.tv_sec, c.tv_nsec.into())
}

/// Whether mtime and ctime changed from `before` to `after`.
fn changed(before: Times, after: Times) -> (bool, bool) {
    (
        (before.0, before.1) != (after.0, after.1),
        (before.2, before.3) != (after.2, after.3),
    )
}

/// A mapped write to `path` (an 8 KiB file whose mtime is set back to 2001 first), seen
/// by `stat` of the same path: after msync with the mapping and file still open, then
/// after munmap and close. `msync` false: unmapped without it (as a process that
/// exits). Returns (mtime, ctime) changed at each point, and the times seen last.
fn mapped_write(path: &Path, msync: bool) -> (Vec<(bool, bool)>, Times) {
    fs::write(path, vec![1u8; 8192]).unwrap();
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(978_307_200);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let before = times(path);
    // Timestamps are taken at a clock tick: let one pass.
    std::thread::sleep(Duration::from_millis(20));
    let file = corofuse_tests::open_rw(path).unwrap();
    let map = Mapping::map(&file, 0, 8192, Access::ReadWrite, Sharing::Shared).unwrap();
    map.write(100, b"mapped");
    let mut seen = Vec::new();
    if msync {
        map.sync(100, 6).unwrap();
        seen.push(changed(before, times(path)));
    }
    drop(map);
    drop(file);
    let last = times(path);
    seen.push(changed(before, last));
    (seen, last)
}

dispatch_tests!(dir_conformance_times_after_a_mapped_write);
/// Issue 32, item 1: a write through a shared mapping changes mtime and ctime, and
/// `stat` through the mount shows it (after msync, and after munmap and close), as on
/// the source; with passthrough the mapping is the source file's own, and the mount
/// shows its times. Attributes are cached for 60 s, so a stale cache would show.
fn dir_conformance_times_after_a_mapped_write(mode: Dispatch) {
    for policy in POLICIES {
        let sides = Sides::mount(mode, policy, &["--timeout", "60"]);
        for msync in [true, false] {
            let name = format!("mapped-{msync}");
            let (want, _) = mapped_write(&sides.direct(&name), msync);
            let (got, shown) = mapped_write(&sides.through(&name), msync);
            assert!(want.iter().all(|&c| c == (true, true)), "source: {want:?}");
            assert_eq!(
                got, want,
                "{mode} --passthrough {policy}, msync {msync}: (mtime, ctime) changed"
            );
            assert_eq!(
                shown,
                times(&sides.backing(&name)),
                "{mode} --passthrough {policy}: the mount shows its source file's times"
            );
        }
        sides.stop();
    }
}

/// The end of the file after ftruncate: not a multiple of 512.
const UNALIGNED_END: usize = 0x79f4a;

/// fsx's failing steps on `path`: an O_DIRECT file of 0x72000 bytes, extended by
/// ftruncate to [`UNALIGNED_END`], its last pages mapped shared from 0x6b000 and written
/// from 0x6be00 to the end, msynced. The msync's outcome, and the file's bytes after.
fn msync_unaligned_end(path: &Path) -> (Result<(), i32>, Vec<u8>) {
    fs::write(path, b"").unwrap();
    let file = corofuse_tests::open_direct(path, true).unwrap();
    let buf = corofuse_tests::AlignedBuf::from_slice(&corofuse_tests::pattern(1, 0, 0x72000));
    file.write_all_at(&buf, 0).unwrap();
    file.set_len(UNALIGNED_END as u64).unwrap();
    let (page, start) = (0x6b000, 0x6be00);
    let map = Mapping::map(
        &file,
        page as u64,
        UNALIGNED_END - page,
        Access::ReadWrite,
        Sharing::Shared,
    )
    .unwrap();
    map.write(
        start - page,
        &corofuse_tests::pattern(2, start as u64, UNALIGNED_END - start),
    );
    let synced = map
        .sync(0, UNALIGNED_END - page)
        .map_err(|e| e.raw_os_error().unwrap_or(0));
    drop(map);
    drop(file);
    (synced, fs::read(path).unwrap())
}

dispatch_tests!(dir_conformance_msync_of_an_o_direct_mapping_with_a_partial_last_page);
/// Issue 32, item 5: msync of a shared mapping of an O_DIRECT file succeeds and the
/// mapped bytes reach the file, as on the source, where the file ends inside a page
/// (the kernel writes the last page back up to the end of the file: a write whose
/// length no O_DIRECT descriptor takes).
fn dir_conformance_msync_of_an_o_direct_mapping_with_a_partial_last_page(mode: Dispatch) {
    for policy in POLICIES {
        let sides = Sides::mount(mode, policy, &[]);
        let want = msync_unaligned_end(&sides.direct("fsx"));
        let got = msync_unaligned_end(&sides.through("fsx"));
        assert_eq!(want.0, Ok(()), "msync on the source");
        assert_eq!(got.0, want.0, "{mode} --passthrough {policy}: msync");
        corofuse_tests::assert_bytes_eq(
            &fs::read(sides.backing("fsx")).unwrap(),
            &want.1,
            &format!("{mode} --passthrough {policy}: the file after msync"),
        );
        sides.stop();
    }
}
