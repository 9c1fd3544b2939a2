//! Security: nobody gets in through an export where the source would keep them out.
//!
//! A root daemon serves each export with `--allow-other`; user `nobody` (65534, no
//! supplementary groups) runs each operation through the `unprivileged` helper twice: on
//! a tree on the source itself and on an identical tree through the mount. What it
//! printed (`ok`, or the errno) and what it left (type, mode, owner of each file named,
//! read on the source as root) must be the same. Every case runs in one mount per
//! transport, and every mismatch is listed before the test fails.
//!
//! Cases: privilege bits (set-user-ID, set-group-ID with and without group execute)
//! after write, truncate, `O_TRUNC`, copy_file_range and every fallocate mode; the
//! whiteout `RENAME_WHITEOUT` leaves in a sticky directory; `trusted.*` names in
//! LISTXATTR; and what already held: privileged xattrs and device nodes refused,
//! hard-link protection, sticky directories, owner-only files and directories. Then a
//! symlink race bounded in time, the image export's owner-only file, `--pidfile` and
//! `--stats` planted with symlinks, and `corofuse umount` as nobody.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use corofuse_tests::export::assert_setup_error;
use corofuse_tests::{dispatch_tests, require_tool, sys, Dispatch, MountedExport, Sandbox};

const NOBODY: u32 = 65534;

/// `unprivileged NOBODY NOBODY OP ARGS...`: its one line of output.
fn as_nobody(op: &str, args: &[&Path]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_unprivileged"))
        .args([NOBODY.to_string(), NOBODY.to_string(), op.to_string()])
        .args(args)
        .output()
        .expect("run unprivileged");
    assert!(
        out.status.success(),
        "unprivileged {op} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

/// A file of 8 KiB owned by root with `mode`.
fn root_file(path: &Path, mode: u32) {
    fs::write(path, vec![7u8; 8192]).unwrap();
    set_mode(path, mode);
}

/// What a node is, as a case compares it: type, mode bits and owner, or `missing`.
fn describe(path: &Path) -> String {
    match fs::symlink_metadata(path) {
        Ok(m) => format!(
            "{:o} {:04o} {}:{} rdev {}",
            m.mode() >> 12,
            m.mode() & 0o7777,
            m.uid(),
            m.gid(),
            m.rdev()
        ),
        Err(e) => format!("missing ({})", e.kind()),
    }
}

/// One security case: a tree made as root, then steps run as nobody, then the nodes
/// compared.
struct Case {
    name: &'static str,
    /// Makes the case's files in the (empty, 0755) directory given.
    setup: fn(&Path),
    /// As nobody, in order: an operation and its arguments, paths relative to the case
    /// directory, or literals after a `=`.
    steps: &'static [(&'static str, &'static [&'static str])],
    /// The nodes to compare afterwards, relative to the case directory.
    observe: &'static [&'static str],
}

/// A privilege-bits case: `f` (8 KiB, owned by root, `mode`), `data` (4 KiB readable)
/// for copies, then the one step, then `f` compared.
macro_rules! bits_case {
    ($name:literal, $mode:literal, $op:literal $(, $arg:literal)*) => {
        Case {
            name: $name,
            setup: |dir| {
                root_file(&dir.join("f"), $mode);
                root_file(&dir.join("data"), 0o644);
            },
            steps: &[($op, &["f" $(, $arg)*])],
            observe: &["f"],
        }
    };
}

fn cases() -> Vec<Case> {
    vec![
        bits_case!("write, set-user-ID", 0o4777, "write"),
        bits_case!("write, set-group-ID group-executable", 0o2777, "write"),
        bits_case!("write, set-group-ID not group-executable", 0o2767, "write"),
        bits_case!("write, both bits", 0o6777, "write"),
        bits_case!("truncate", 0o6777, "truncate", "=100"),
        bits_case!("O_TRUNC open", 0o6777, "open-trunc"),
        bits_case!("fallocate allocate", 0o6777, "fallocate", "=alloc"),
        bits_case!("fallocate keep size", 0o6777, "fallocate", "=keep"),
        bits_case!("fallocate zero range", 0o6777, "fallocate", "=zero"),
        bits_case!("fallocate punch hole", 0o6777, "fallocate", "=punch"),
        Case {
            name: "copy_file_range",
            setup: |dir| {
                root_file(&dir.join("f"), 0o6777);
                root_file(&dir.join("data"), 0o644);
            },
            steps: &[("copy", &["data", "f"])],
            observe: &["f"],
        },
        Case {
            name: "RENAME_WHITEOUT in a sticky directory, then removing the whiteout",
            setup: |dir| {
                let sticky = dir.join("sticky");
                fs::create_dir(&sticky).unwrap();
                set_mode(&sticky, 0o1777);
                fs::write(sticky.join("mine"), b"mine").unwrap();
                chown(&sticky.join("mine"), NOBODY, NOBODY);
            },
            steps: &[
                ("whiteout", &["sticky/mine", "sticky/moved"]),
                ("unlink", &["sticky/mine"]),
            ],
            observe: &["sticky/mine", "sticky/moved"],
        },
        Case {
            name: "RENAME_WHITEOUT, the whiteout kept",
            setup: |dir| {
                let open = dir.join("open");
                fs::create_dir(&open).unwrap();
                set_mode(&open, 0o777);
                fs::write(open.join("mine"), b"mine").unwrap();
                chown(&open.join("mine"), NOBODY, NOBODY);
            },
            steps: &[("whiteout", &["open/mine", "open/moved"])],
            observe: &["open/mine", "open/moved"],
        },
        Case {
            name: "LISTXATTR with trusted.* names",
            setup: |dir| {
                let f = dir.join("x");
                root_file(&f, 0o644);
                sys::setxattr(&f, "trusted.secret", b"s").unwrap();
                sys::setxattr(&f, "user.visible", b"v").unwrap();
            },
            steps: &[("listxattr", &["x"])],
            observe: &["x"],
        },
        Case {
            name: "trusted.* and security.* xattrs refused",
            setup: |dir| {
                let f = dir.join("x");
                root_file(&f, 0o666);
            },
            steps: &[
                ("setxattr", &["x", "=trusted.mine"]),
                ("setxattr", &["x", "=security.mine"]),
            ],
            observe: &["x"],
        },
        Case {
            name: "device nodes refused",
            setup: |dir| {
                let d = dir.join("d");
                fs::create_dir(&d).unwrap();
                set_mode(&d, 0o777);
            },
            steps: &[("mknod-dev", &["d/null"])],
            observe: &["d/null"],
        },
        Case {
            name: "hard link to another's file (protected_hardlinks)",
            setup: |dir| {
                root_file(&dir.join("secret"), 0o600);
                let d = dir.join("d");
                fs::create_dir(&d).unwrap();
                set_mode(&d, 0o777);
            },
            steps: &[("link", &["secret", "d/mine"])],
            observe: &["secret", "d/mine"],
        },
        Case {
            name: "another's file in a sticky directory",
            setup: |dir| {
                let sticky = dir.join("sticky");
                fs::create_dir(&sticky).unwrap();
                set_mode(&sticky, 0o1777);
                root_file(&sticky.join("roots"), 0o666);
            },
            steps: &[
                ("unlink", &["sticky/roots"]),
                ("whiteout", &["sticky/roots", "sticky/taken"]),
            ],
            observe: &["sticky/roots", "sticky/taken"],
        },
        Case {
            name: "owner-only file and directory",
            setup: |dir| {
                root_file(&dir.join("private"), 0o600);
                let d = dir.join("closed");
                fs::create_dir(&d).unwrap();
                set_mode(&d, 0o700);
                root_file(&d.join("inside"), 0o666);
            },
            steps: &[
                ("read", &["private"]),
                ("write", &["private"]),
                ("truncate", &["private", "=0"]),
                ("read", &["closed/inside"]),
                ("write", &["closed/inside"]),
            ],
            observe: &["private", "closed/inside"],
        },
    ]
}

/// Runs a case in `dir` (made empty here): the outcome lines and the nodes after.
fn run_case(case: &Case, setup_dir: &Path, op_dir: &Path) -> (Vec<String>, Vec<String>) {
    let outcomes = case
        .steps
        .iter()
        .map(|(op, args)| {
            let paths: Vec<PathBuf> = args
                .iter()
                .map(|a| {
                    a.strip_prefix('=')
                        .map_or_else(|| op_dir.join(a), PathBuf::from)
                })
                .collect();
            let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
            format!("{op}: {}", as_nobody(op, &refs))
        })
        .collect();
    let nodes = case
        .observe
        .iter()
        .map(|name| format!("{name}: {}", describe(&setup_dir.join(name))))
        .collect();
    (outcomes, nodes)
}

/// A directory nobody can reach (every component 0755).
fn open_dir(path: &Path) -> &Path {
    fs::create_dir_all(path).unwrap();
    set_mode(path, 0o755);
    path
}

dispatch_tests!(security_dir_export_does_what_the_source_does);
/// Every case on the source and through a `--allow-other` mount of a root daemon: the
/// same outcomes and the same nodes left.
fn security_dir_export_does_what_the_source_does(mode: Dispatch) {
    let sandbox = Sandbox::new();
    let root = open_dir(sandbox.path("tree").as_path()).to_path_buf();
    set_mode(sandbox.path("").as_path(), 0o755);
    let (direct, mounted) = (
        open_dir(&root.join("direct")).to_path_buf(),
        open_dir(&root.join("mounted")).to_path_buf(),
    );
    let mnt = open_dir(&sandbox.path("mnt")).to_path_buf();
    let args = ["--allow-other", "--timeout", "0", "--node-fds", "16"];
    let export = MountedExport::start_dir(&root, &mnt, mode, &args);
    let mut mismatches = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let (on_source, via_mount) = (direct.join(i.to_string()), mounted.join(i.to_string()));
        for dir in [&on_source, &via_mount] {
            open_dir(dir);
            (case.setup)(dir);
        }
        let want = run_case(case, &on_source, &on_source);
        let got = run_case(
            case,
            &via_mount,
            &export.path().join("mounted").join(i.to_string()),
        );
        if want != got {
            mismatches.push(format!(
                "{}:\n  source: {:?} {:?}\n  mount:  {:?} {:?}",
                case.name, want.0, want.1, got.0, got.1
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{mode}: {} of {} cases differ from the source:\n{}",
        mismatches.len(),
        cases().len(),
        mismatches.join("\n")
    );
    export.stop();
}

dispatch_tests!(security_dir_export_never_follows_a_swapped_symlink_out_of_the_source[coroutine, threads, uring]);
/// For two seconds a thread swaps `race/d` on the source between a directory and a
/// symlink `../../outside` while `nobody` reads `race/d/secret` through the mount (no
/// caches, few node descriptors, so nodes go cold and are reopened by file handle). On
/// the source, that symlink reaches the sandbox's `outside/secret`; through the mount
/// the client's kernel resolves it beside the mountpoint, where `outside/secret` is a
/// decoy. The secret must never be read: the daemon resolves names under the nodes it
/// holds and never follows a symlink of the source.
fn security_dir_export_never_follows_a_swapped_symlink_out_of_the_source(mode: Dispatch) {
    let (source_side, mount_side) = (Sandbox::new(), Sandbox::new());
    for s in [&source_side, &mount_side] {
        set_mode(s.path("").as_path(), 0o755);
    }
    let src = open_dir(&source_side.path("src")).to_path_buf();
    open_dir(&source_side.path("outside"));
    fs::write(source_side.path("outside/secret"), b"SECRET").unwrap();
    open_dir(&mount_side.path("outside"));
    fs::write(mount_side.path("outside/secret"), b"DECOY").unwrap();
    let race = open_dir(&src.join("race")).to_path_buf();
    let mnt = open_dir(&mount_side.path("mnt")).to_path_buf();
    let args = ["--allow-other", "--timeout", "0", "--node-fds", "4"];
    let export = MountedExport::start_dir(&src, &mnt, mode, &args);
    let stop = AtomicBool::new(false);
    let through_mount = export.path().join("race/d/secret");
    let reads = std::thread::scope(|scope| {
        scope.spawn(|| {
            let (d, tmp) = (race.join("d"), race.join("d.new"));
            while !stop.load(Ordering::Relaxed) {
                let _ = fs::create_dir(&tmp);
                let _ = fs::write(tmp.join("secret"), b"INSIDE");
                let _ = fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755));
                let _ = fs::rename(&tmp, &d);
                let _ = fs::remove_file(d.join("secret"));
                let _ = fs::remove_dir(&d);
                let _ = std::os::unix::fs::symlink("../../outside", &d);
                std::thread::yield_now();
                let _ = fs::remove_file(&d);
            }
        });
        let started = Instant::now();
        let mut seen = std::collections::BTreeMap::<String, u32>::new();
        while started.elapsed() < Duration::from_secs(2) {
            let out = as_nobody("read", &[&through_mount]);
            *seen.entry(out).or_default() += 1;
            if let Ok(text) = fs::read_to_string(&through_mount) {
                *seen.entry(format!("root read {text}")).or_default() += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        seen
    });
    let contents = |path: &Path| fs::read(path).unwrap_or_default();
    assert_eq!(contents(&source_side.path("outside/secret")), b"SECRET");
    assert!(
        !reads.keys().any(|k| k.contains("SECRET")),
        "{mode}: the secret outside the source was read through the mount: {reads:?}"
    );
    assert!(
        reads.values().sum::<u32>() > 10,
        "{mode}: too few reads: {reads:?}"
    );
    export.stop();
}

dispatch_tests!(security_image_export_is_owner_only);
/// `mount -w --allow-other` as root: the exported file is `0600 root` (as QEMU shows it),
/// so nobody can neither read, write nor truncate it, as on the image file itself; the
/// owner grants access through the mount (chmod, then chown), and then nobody can.
fn security_image_export_is_owner_only(mode: Dispatch) {
    let sandbox = Sandbox::new();
    set_mode(sandbox.path("").as_path(), 0o755);
    let image = sandbox.file("disk.img", &[5u8; 1 << 20]);
    set_mode(&image, 0o600);
    let mnt = sandbox.file("disk.mnt", b"");
    let export = MountedExport::start(&image, &mnt, mode, &["-w", "--allow-other"]);
    let m = export.path();
    assert_eq!(fs::metadata(m).unwrap().mode() & 0o7777, 0o600, "{mode}");
    for (op, args) in [("read", vec![]), ("write", vec![]), ("truncate", vec!["0"])] {
        let on = |file: &Path| {
            let mut paths = vec![file.to_path_buf()];
            paths.extend(args.iter().map(PathBuf::from));
            let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
            as_nobody(op, &refs)
        };
        let (source, mount) = (on(&image), on(m));
        assert_eq!(mount, source, "{mode}: {op} as nobody");
        assert_eq!(mount, format!("err {}", libc::EACCES), "{mode}: {op}");
    }
    assert_eq!(fs::metadata(m).unwrap().len(), 1 << 20, "{mode}: size kept");
    set_mode(m, 0o606);
    assert_eq!(as_nobody("write", &[m]), "ok", "{mode}: after chmod o+rw");
    set_mode(m, 0o600);
    chown(m, NOBODY, NOBODY);
    assert_eq!(fs::metadata(m).unwrap().uid(), NOBODY, "{mode}");
    assert_eq!(as_nobody("read", &[m]), "ok", "{mode}: after chown");
    export.stop();
}

/// A root-owned 0600 file outside, and symlinks to it planted where the daemon will
/// write its pidfile and stats, in a sticky world-writable directory (as /tmp is).
struct Planted {
    _sandbox: Sandbox,
    precious: PathBuf,
    pidfile: PathBuf,
    stats: PathBuf,
}

impl Planted {
    fn new() -> Planted {
        let sandbox = Sandbox::new();
        let precious = sandbox.path("precious");
        root_file(&precious, 0o600);
        let public = sandbox.path("public");
        fs::create_dir(&public).unwrap();
        set_mode(&public, 0o1777);
        let (pidfile, stats) = (public.join("corofuse.pid"), public.join("stats.json"));
        for link in [&pidfile, &stats] {
            std::os::unix::fs::symlink(&precious, link).unwrap();
        }
        Planted {
            _sandbox: sandbox,
            precious,
            pidfile,
            stats,
        }
    }

    /// The planted target is untouched, and each path is now a file of the daemon's;
    /// once the daemon has exited (`live` false), its pidfile is gone.
    #[track_caller]
    fn assert_kept(&self, pid: u32, live: bool) {
        assert_eq!(fs::read(&self.precious).unwrap(), vec![7u8; 8192]);
        let meta = fs::symlink_metadata(&self.stats).unwrap();
        assert!(
            meta.is_file(),
            "{} is not a regular file",
            self.stats.display()
        );
        match live {
            true => assert_eq!(
                fs::read_to_string(&self.pidfile).unwrap(),
                format!("{pid}\n")
            ),
            false => assert!(
                fs::symlink_metadata(&self.pidfile).is_err(),
                "the pidfile (or the link) is left after the exit"
            ),
        }
    }
}

dispatch_tests!(security_pidfile_and_stats_never_follow_a_symlink[coroutine, threads]);
/// `--pidfile` and `--stats` in a world-writable directory where symlinks to a root
/// file were planted: the daemon replaces the links with its own files (at start, on
/// SIGUSR1 and at exit), and the file they pointed to is never written.
fn security_pidfile_and_stats_never_follow_a_symlink(mode: Dispatch) {
    for dir_export in [false, true] {
        let planted = Planted::new();
        let sandbox = Sandbox::new();
        let args = [
            "--pidfile",
            planted.pidfile.to_str().unwrap(),
            "--stats",
            planted.stats.to_str().unwrap(),
        ];
        let mut export = if dir_export {
            let (src, mnt) = (sandbox.path("src"), sandbox.path("mnt"));
            fs::create_dir(&src).unwrap();
            fs::create_dir(&mnt).unwrap();
            MountedExport::start_dir(&src, &mnt, mode, &args)
        } else {
            let mnt = sandbox.file("disk.mnt", b"");
            MountedExport::start("null:1M", &mnt, mode, &args)
        };
        let pid = export.pid();
        export.signal(libc::SIGUSR1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::symlink_metadata(&planted.stats).is_ok_and(|m| m.is_symlink()) {
            assert!(Instant::now() < deadline, "no stats after SIGUSR1");
            std::thread::sleep(Duration::from_millis(10));
        }
        planted.assert_kept(pid, true);
        export.stop();
        planted.assert_kept(pid, false);
        let stats = fs::read_to_string(&planted.stats).unwrap();
        assert!(stats.starts_with('{'), "stats: {stats}");
    }
}

dispatch_tests!(security_umount_as_nobody_refuses_roots_mount[coroutine]);
/// `corofuse umount` run by nobody on root's `--allow-other` mount fails and leaves it.
fn security_umount_as_nobody_refuses_roots_mount(mode: Dispatch) {
    use std::os::unix::process::CommandExt;
    let sandbox = Sandbox::new();
    set_mode(sandbox.path("").as_path(), 0o755);
    let mnt = sandbox.file("disk.mnt", b"");
    let export = MountedExport::start("null:1M", &mnt, mode, &["--allow-other"]);
    let mut command = Command::new(corofuse_tests::bin::corofuse());
    command.arg("umount").arg(export.path());
    // SAFETY: become_user makes only setgroups, setgid and setuid calls, which are
    // async-signal-safe.
    unsafe { command.pre_exec(|| sys::become_user(NOBODY, NOBODY)) };
    let out = command.output().unwrap();
    assert!(!out.status.success(), "nobody unmounted root's mount");
    assert!(
        corofuse_tests::mountinfo::is_corofuse_mount(export.path()),
        "the mount is gone: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    export.stop();
}

dispatch_tests!(security_dir_cleared_bits_show_at_once_through_the_mount);
/// After nobody's write, fallocate or copy into a set-user-ID file, `stat` through the
/// mount shows the bits gone at once, as on the source, not after the attribute timeout
/// (here 60 s, so that a stale cache would show): the kernel asks again for attributes
/// after a data change. With the default passthrough, `never`, the writeback cache and
/// `--cache never` (issue 26 item 4 reported the opposite; not reproduced here).
fn security_dir_cleared_bits_show_at_once_through_the_mount(mode: Dispatch) {
    for extra in [
        &[][..],
        &["--passthrough", "never"],
        &["--writeback"],
        &["--cache", "never"],
    ] {
        cleared_bits_show_at_once(mode, extra);
    }
}

fn cleared_bits_show_at_once(mode: Dispatch, extra: &[&str]) {
    let sandbox = Sandbox::new();
    let root = open_dir(sandbox.path("tree").as_path()).to_path_buf();
    set_mode(sandbox.path("").as_path(), 0o755);
    let mnt = open_dir(&sandbox.path("mnt")).to_path_buf();
    let mut args = vec!["--allow-other", "--timeout", "60"];
    args.extend_from_slice(extra);
    let export = MountedExport::start_dir(&root, &mnt, mode, &args);
    root_file(&root.join("data"), 0o644);
    for (i, (op, extra)) in [
        ("write", None),
        ("fallocate", Some("=zero")),
        ("copy", None),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("f{i}");
        root_file(&root.join(&name), 0o6777);
        let through = export.path().join(&name);
        // Cached now: the kernel holds the attributes with both bits.
        assert_eq!(fs::metadata(&through).unwrap().mode() & 0o7777, 0o6777);
        let out = match (op, extra) {
            ("copy", _) => as_nobody(op, &[&export.path().join("data"), &through]),
            (_, Some(lit)) => as_nobody(op, &[&through, Path::new(&lit[1..])]),
            _ => as_nobody(op, &[&through]),
        };
        assert_eq!(out, "ok", "{mode} {extra:?}: {op}");
        let seen = fs::metadata(&through).unwrap().mode() & 0o7777;
        let on_source = fs::metadata(root.join(&name)).unwrap().mode() & 0o7777;
        assert_eq!(on_source, 0o777, "{mode} {extra:?}: {op} on the source");
        assert_eq!(
            seen, on_source,
            "{mode} {extra:?}: {op}: stat through the mount"
        );
    }
    export.stop();
}

/// A root-only host file, a 1 MiB raw image of zeroes and a world-readable qcow2 header
/// (made by qemu-img) whose backing file is that host file: what a writer of the export
/// would put in the image's first sector to read the host file at the next probed open.
struct ProbeBait {
    sandbox: Sandbox,
    secret: PathBuf,
    image: PathBuf,
    header: PathBuf,
}

impl ProbeBait {
    fn new() -> ProbeBait {
        let sandbox = Sandbox::new();
        set_mode(sandbox.path("").as_path(), 0o755);
        let secret = sandbox.file("secret", &[b'S'; 4096]);
        set_mode(&secret, 0o600);
        let image = sandbox.file("probe.img", &vec![0u8; 1 << 20]);
        let header = sandbox.path("header.qcow2");
        corofuse_tests::qcow2::qemu_img(&[
            "create".as_ref(),
            "-q".as_ref(),
            "-f".as_ref(),
            "qcow2".as_ref(),
            "-F".as_ref(),
            "raw".as_ref(),
            "-b".as_ref(),
            secret.as_os_str(),
            header.as_os_str(),
            "1M".as_ref(),
        ]);
        set_mode(&header, 0o644);
        ProbeBait {
            sandbox,
            secret,
            image,
            header,
        }
    }
}

dispatch_tests!(security_probed_raw_export_refuses_a_foreign_header_from_its_writer);
/// `mount -w --allow-other IMAGE` with no `--format`: the raw image's writer (nobody, given
/// the file by chmod through the mount) cannot write a qcow2 header naming a host file into
/// its first sector (EPERM, as QEMU refuses it); the same bytes past the first sector and
/// ordinary first-sector writes go through; the daemon warns that it probed; a later
/// probed open still finds raw and never serves the host file.
fn security_probed_raw_export_refuses_a_foreign_header_from_its_writer(mode: Dispatch) {
    require_tool!("qemu-img");
    let bait = ProbeBait::new();
    let mnt = bait.sandbox.file("probe.mnt", b"");
    let export = MountedExport::start(&bait.image, &mnt, mode, &["-w", "--allow-other"]);
    let m = export.path();
    set_mode(m, 0o666);
    let write_header =
        |offset: &str| as_nobody("write-from", &[m, bait.header.as_path(), Path::new(offset)]);
    assert_eq!(write_header("0"), format!("err {}", libc::EPERM), "{mode}");
    assert_eq!(write_header("512"), "ok", "{mode}: past the first sector");
    assert_eq!(as_nobody("write", &[m]), "ok", "{mode}: an ordinary write");
    let stderr = export.stderr();
    assert!(
        stderr.contains("probe found raw") && stderr.contains("--format raw"),
        "{mode}: no warning that the format was probed: {stderr}"
    );
    export.stop();
    let on_disk = fs::read(&bait.image).unwrap();
    assert!(
        !on_disk.starts_with(b"QFI\xfb"),
        "{mode}: the header landed"
    );
    assert_eq!(on_disk[0], b'x', "{mode}");
    let export = MountedExport::start(&bait.image, &mnt, mode, &[]);
    assert_eq!(
        fs::read(export.path()).unwrap(),
        on_disk,
        "{mode}: served raw"
    );
    export.stop();
}

dispatch_tests!(security_probed_qcow2_never_follows_its_backing_file[coroutine]);
/// An image that probes as qcow2 and names a backing file (what the previous test keeps
/// a writer from making) is refused without `--format qcow2`, in one line that says so;
/// given the format, the backing file is followed, but never through a symbolic link nor,
/// for a relative name, out of the image's directory. (Refused before anything is
/// served: one dispatch mode covers it.)
fn security_probed_qcow2_never_follows_its_backing_file(mode: Dispatch) {
    require_tool!("qemu-img");
    let bait = ProbeBait::new();
    let sandbox = &bait.sandbox;
    let mnt = sandbox.file("probe.mnt", b"");
    fs::copy(&bait.header, &bait.image).unwrap();
    let image = bait.image.as_os_str();
    assert_setup_error(
        sandbox,
        image,
        &mnt,
        &[],
        &["--format qcow2", "backing file"],
    );
    let export = MountedExport::start(&bait.image, &mnt, mode, &["--format", "qcow2"]);
    let served = fs::read(export.path()).unwrap();
    assert_eq!(
        &served[..4096],
        &fs::read(&bait.secret).unwrap()[..],
        "named, followed"
    );
    export.stop();
    let link = sandbox.path("link");
    std::os::unix::fs::symlink(&bait.secret, &link).unwrap();
    fs::create_dir(sandbox.path("sub")).unwrap();
    let nested = sandbox.path("sub/top.qcow2");
    for (backing, top, words) in [
        (link.to_str().unwrap(), &bait.image, "symbolic link"),
        ("link", &bait.image, "symbolic link"),
        ("../secret", &nested, "goes up (..)"),
    ] {
        corofuse_tests::qcow2::qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-u",
            "-F",
            "raw",
            "-b",
            backing,
            top.to_str().unwrap(),
            "1M",
        ]);
        let args = ["--format", "qcow2"];
        assert_setup_error(sandbox, top.as_os_str(), &mnt, &args, &[words, backing]);
    }
}
