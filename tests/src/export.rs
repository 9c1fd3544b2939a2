//! [`MountedExport`]: one `corofuse mount` daemon, live until dropped, and never a mount
//! left behind.
//!
//! `start` runs the daemon in a [`Dispatch`] mode with a pidfile (its own, or the one the
//! test passes with `--pidfile`) and returns once the pidfile holds its PID *and*
//! /proc/self/mountinfo shows a `fuse.corofuse` mount on the mountpoint. Dropping the guard
//! (also while unwinding from a failed assertion) sends SIGTERM, waits, SIGKILLs the PID it
//! started if the daemon hangs, and lazily unmounts whatever mount it added if one is left.
//! The daemon also gets SIGTERM if the thread that started it dies (`PR_SET_PDEATHSIG`), so
//! keep the guard on the thread that created it.
//!
//! For runs that must fail: [`run_to_exit`], and [`assert_setup_error`] for the contract of
//! a refused `corofuse mount` (one line, no pidfile, no mount).

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::diag;
use crate::dispatch::Dispatch;
use crate::mountinfo::{fuse_mounts_at, is_corofuse_mount};
use crate::require::note;
use crate::sandbox::Sandbox;
use crate::sys;

/// How long a daemon may take to mount, or to exit after SIGTERM or an unmount.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A live `corofuse mount IMAGE MOUNTPOINT ARGS... --dispatch MODE`.
pub struct MountedExport {
    child: Child,
    dispatch: Dispatch,
    status: Option<ExitStatus>,
    mountpoint: PathBuf,
    /// FUSE mounts on the mountpoint before we started: Drop unmounts only ours.
    mounts_before: usize,
    /// False once the test said the daemon's mount is gone for good
    /// ([`released`](Self::released)): a mount on the path then is another's.
    owns_mount: bool,
    /// Holds the pidfile and the daemon's stderr.
    scratch: TempDir,
}

impl MountedExport {
    /// Starts `corofuse mount IMAGE MOUNTPOINT ARGS... --dispatch MODE` and waits until the
    /// mount is live; panics (with its stderr) if it exits or takes longer than [`TIMEOUT`].
    #[track_caller]
    pub fn start(
        image: impl AsRef<OsStr>,
        mountpoint: &Path,
        dispatch: Dispatch,
        args: &[&str],
    ) -> MountedExport {
        Self::try_start(image, mountpoint, dispatch, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `corofuse mount-dir SOURCE MOUNTPOINT ARGS... --dispatch MODE` (the directory
    /// export) and waits until the mount is live, as [`start`](Self::start) does.
    #[track_caller]
    pub fn start_dir(
        source: &Path,
        mountpoint: &Path,
        dispatch: Dispatch,
        args: &[&str],
    ) -> MountedExport {
        Self::try_start_command("mount-dir", source.as_os_str(), mountpoint, dispatch, args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`start`](Self::start), but returns the failure.
    pub fn try_start(
        image: impl AsRef<OsStr>,
        mountpoint: &Path,
        dispatch: Dispatch,
        args: &[&str],
    ) -> Result<MountedExport, String> {
        Self::try_start_command("mount", image.as_ref(), mountpoint, dispatch, args)
    }

    fn try_start_command(
        subcommand: &str,
        image: &OsStr,
        mountpoint: &Path,
        dispatch: Dispatch,
        args: &[&str],
    ) -> Result<MountedExport, String> {
        let mountpoint = fs::canonicalize(mountpoint)
            .map_err(|e| format!("mountpoint {}: {e}", mountpoint.display()))?;
        let scratch = tempfile::Builder::new()
            .prefix("corofuse-daemon-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        // A test that passes its own `--pidfile` has the daemon write it there.
        let given = args
            .iter()
            .position(|&a| a == "--pidfile")
            .and_then(|i| args.get(i + 1));
        let pidfile = given.map_or_else(|| scratch.path().join("pid"), PathBuf::from);
        let stderr = File::create(scratch.path().join("stderr")).map_err(|e| e.to_string())?;
        let mounts_before = fuse_mounts_at(&mountpoint);
        let mut command = Command::new(crate::bin::corofuse());
        command
            .arg(subcommand)
            .arg(image)
            .arg(&mountpoint)
            .args(args)
            .args(dispatch.args());
        if given.is_none() {
            command.arg("--pidfile").arg(&pidfile);
        }
        command
            .env("RUST_LOG", log_level())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
        unsafe { command.pre_exec(sys::term_with_parent) };
        let child = command
            .spawn()
            .map_err(|e| format!("spawn corofuse: {e}"))?;
        let mut export = MountedExport {
            child,
            dispatch,
            status: None,
            mountpoint,
            mounts_before,
            owns_mount: true,
            scratch,
        };
        export.wait_live(&pidfile)?;
        Ok(export)
    }

    fn wait_live(&mut self, pidfile: &Path) -> Result<(), String> {
        let start = Instant::now();
        let pid = self.pid().to_string();
        loop {
            if let Some(status) = self.try_status() {
                return Err(format!(
                    "corofuse (--dispatch {}) exited ({status}) before the mount was live; \
                     stderr:\n{}",
                    self.dispatch,
                    self.stderr()
                ));
            }
            let written = fs::read_to_string(pidfile).is_ok_and(|s| s.trim() == pid);
            if written && is_corofuse_mount(&self.mountpoint) {
                return Ok(());
            }
            if start.elapsed() > TIMEOUT {
                return Err(format!(
                    "corofuse (--dispatch {}) not live after {TIMEOUT:?} (pidfile written: \
                     {written}); stderr:\n{}",
                    self.dispatch,
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The `--dispatch` mode it runs in.
    pub fn dispatch(&self) -> Dispatch {
        self.dispatch
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The mountpoint, absolute (as in /proc/self/mountinfo).
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.scratch.path().join("stderr")).unwrap_or_default()
    }

    /// Sends `signal` to the daemon (unless it has been reaped already).
    pub fn signal(&mut self, signal: i32) {
        if self.try_status().is_none() {
            sys::kill(self.pid(), signal).expect("kill(2) our own child");
        }
    }

    /// The exit status, if the daemon has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// SIGKILL (to the PID we started), reap, and detach the mount it leaves: for a
    /// daemon known to hang, without Drop's graceful wait.
    pub fn kill(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.clean_up();
    }

    /// A crash: SIGKILL to the PID we started, and reap it. Unlike [`kill`](Self::kill),
    /// this leaves the mount behind (its server gone: every access fails with ENOTCONN)
    /// for the test to clean up with [`umount`]; Drop detaches it if the test does not.
    /// Panics if the daemon had exited already.
    #[track_caller]
    pub fn crash(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        if let Some(status) = self.try_status() {
            panic!(
                "the daemon exited ({status}) before SIGKILL; stderr:\n{}",
                self.stderr()
            );
        }
        self.signal(libc::SIGKILL);
        let status = self.wait_exit(TIMEOUT).expect("a daemon dies of SIGKILL");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while self.try_status().is_none() && start.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.status
    }

    /// SIGTERM, then the exit status; panics if the daemon is still running after
    /// [`TIMEOUT`] (Drop then kills it).
    #[track_caller]
    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        match self.wait_exit(TIMEOUT) {
            Some(status) => status,
            None => panic!(
                "corofuse (--dispatch {}) still running {TIMEOUT:?} after SIGTERM; {}",
                self.dispatch,
                self.diagnose()
            ),
        }
    }

    /// For a daemon that hangs: its threads' wait channels, the operations its rings wait
    /// on, and its stderr.
    pub fn diagnose(&self) -> String {
        format!(
            "threads: {}\nio_uring: {}\nstderr:\n{}",
            diag::threads(self.pid()),
            diag::ring_polls(self.pid()),
            self.stderr()
        )
    }

    /// SIGTERM, and asserts the contract: exit status 0, no mount left.
    #[track_caller]
    pub fn stop(mut self) {
        let status = self.terminate();
        assert!(
            status.success(),
            "corofuse (--dispatch {}) exited with {status} after SIGTERM; stderr:\n{}",
            self.dispatch,
            self.stderr()
        );
        self.assert_unmounted();
    }

    /// After [`crash`](Self::crash): `corofuse umount` of the mount the dead daemon left,
    /// which must succeed and leave nothing mounted.
    #[track_caller]
    pub fn umount_after_crash(&self) {
        let cleaned = umount(self.path());
        assert!(
            cleaned.status.success(),
            "corofuse umount: {}",
            cleaned.stderr
        );
        self.assert_unmounted();
    }

    /// Asserts that the mount this export made is gone.
    #[track_caller]
    pub fn assert_unmounted(&self) {
        assert!(
            fuse_mounts_at(&self.mountpoint) <= self.mounts_before,
            "a FUSE mount is left on {}; stderr:\n{}",
            self.mountpoint.display(),
            self.stderr()
        );
    }

    /// Ends the guard of a daemon that exited (see [`wait_exit`](Self::wait_exit)) after
    /// its mount was removed from outside: nothing of it is left, and a mount on the path
    /// now belongs to someone else, which Drop must not detach.
    #[track_caller]
    pub fn released(mut self) {
        assert!(self.status.is_some(), "the daemon has not exited");
        self.owns_mount = false;
    }

    /// Drop's last resort: kill the PID we started, then detach what we mounted.
    fn clean_up(&mut self) {
        if self.try_status().is_none() {
            let _ = sys::kill(self.pid(), libc::SIGTERM);
            if self.wait_exit(TIMEOUT).is_none() {
                note(&format!(
                    "corofuse (pid {}, --dispatch {}) ignored SIGTERM for {TIMEOUT:?}: SIGKILL",
                    self.pid(),
                    self.dispatch
                ));
                let _ = self.child.kill();
                self.status = self.child.wait().ok();
            }
        }
        for _ in 0..8 {
            if !self.owns_mount || fuse_mounts_at(&self.mountpoint) <= self.mounts_before {
                return;
            }
            note(&format!(
                "mount left on {}: umount2(MNT_DETACH)",
                self.mountpoint.display()
            ));
            if let Err(e) = sys::umount_lazy(&self.mountpoint) {
                note(&format!("umount2: {e}"));
                return;
            }
        }
    }
}

impl Drop for MountedExport {
    fn drop(&mut self) {
        self.clean_up();
    }
}

fn log_level() -> String {
    std::env::var("COROFUSE_TEST_LOG").unwrap_or_else(|_| "info".into())
}

/// How a `corofuse` run ended.
#[derive(Debug)]
pub struct Exited {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it wrote to stderr.
    pub stderr: String,
}

/// Runs `corofuse umount PATH` (see [`run_to_exit`]).
pub fn umount(path: &Path) -> Exited {
    run_to_exit(&["umount".as_ref(), path.as_os_str()], path)
}

/// Runs `corofuse ARGS...` (with no `RUST_LOG`: the default logging, as a script gets it)
/// and returns how it ended; panics if it does not exit within [`TIMEOUT`] (after
/// killing it and detaching any mount it added on `mountpoint`).
pub fn run_to_exit(args: &[&OsStr], mountpoint: &Path) -> Exited {
    let abs = fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mounts_before = fuse_mounts_at(&abs);
    let scratch = tempfile::tempdir().expect("temp dir");
    let stderr_path = scratch.path().join("stderr");
    let mut command = Command::new(crate::bin::corofuse());
    command
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&stderr_path).expect("stderr file"));
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe { command.pre_exec(sys::term_with_parent) };
    let mut child = command.spawn().expect("spawn corofuse");
    let status = crate::tool::wait_or_kill(&mut child, TIMEOUT).expect("waitpid");
    let stderr = fs::read_to_string(&stderr_path).unwrap_or_default();
    while fuse_mounts_at(&abs) > mounts_before {
        note(&format!(
            "corofuse left a mount on {}: detaching it",
            abs.display()
        ));
        if sys::umount_lazy(&abs).is_err() {
            break;
        }
    }
    match status {
        Some(status) => Exited { status, stderr },
        None => panic!("corofuse {args:?} still running after {TIMEOUT:?}; stderr:\n{stderr}"),
    }
}

/// Waits until `counter` reaches `n` (I/O through a mount made progress), failing the test
/// with `what` if that takes longer than [`TIMEOUT`].
#[track_caller]
pub fn wait_for_progress(counter: &std::sync::atomic::AtomicU64, n: u64, what: &str) {
    let start = std::time::Instant::now();
    while counter.load(std::sync::atomic::Ordering::SeqCst) < n {
        assert!(start.elapsed() < TIMEOUT, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `corofuse mount IMAGE MOUNTPOINT ARGS --pidfile P`, which must fail, and checks
/// the contract; `words` must appear in the one line on stderr, which is returned.
#[track_caller]
pub fn assert_setup_error(
    sandbox: &Sandbox,
    image: &OsStr,
    mountpoint: &Path,
    args: &[&str],
    words: &[&str],
) -> String {
    let pidfile = sandbox.path("pid");
    let abs = fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mounts_before = fuse_mounts_at(&abs);
    let mut argv: Vec<&OsStr> = vec!["mount".as_ref(), image, mountpoint.as_os_str()];
    argv.extend(args.iter().map(OsStr::new));
    argv.extend(["--pidfile".as_ref(), pidfile.as_os_str()]);
    let failure = run_to_exit(&argv, mountpoint);
    let stderr = &failure.stderr;
    assert!(
        !failure.status.success(),
        "{argv:?} succeeded; stderr:\n{stderr}"
    );
    for word in words {
        assert!(
            stderr.contains(word),
            "{argv:?}: {word:?} not in {stderr:?}"
        );
    }
    assert_eq!(
        stderr.lines().count(),
        1,
        "{argv:?}: not one line on stderr:\n{stderr}"
    );
    assert!(!pidfile.exists(), "{argv:?}: pidfile written");
    assert_eq!(fuse_mounts_at(&abs), mounts_before, "{argv:?}: mount left");
    failure.stderr
}

/// The `--stats` JSON at `path`, once the daemon has written all of it.
pub fn read_stats(path: &Path) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let parsed = fs::read(path).map(|b| serde_json::from_slice::<serde_json::Value>(&b));
        match parsed {
            Ok(Ok(json)) => return json,
            _ if start.elapsed() > TIMEOUT => panic!("no valid JSON in {}", path.display()),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// [`assert_serving_allocates_nothing`] for 4 KiB O_DIRECT reads and writes, alternating,
/// over the first 4 MiB of the export.
#[track_caller]
pub fn assert_4k_io_allocates_nothing(export: &mut MountedExport, stats: &Path) {
    let file = crate::open_direct(export.path(), true).expect("open the mount");
    let mut buf = crate::AlignedBuf::zeroed(4096);
    let mut io = |ops: u64| {
        for i in 0..ops {
            let offset = (i * 7919 % 1024) * 4096;
            if i % 2 == 0 {
                file.read_exact_at(&mut buf, offset).unwrap();
            } else {
                file.write_all_at(&buf, offset).unwrap();
            }
        }
    };
    assert_serving_allocates_nothing(export, stats, &mut io);
}

/// No heap allocation per request in steady state: after `io(2_000)` warms the daemon up,
/// its allocation counter (`--stats` at `stats`, snapshots by SIGUSR1) moves by fewer
/// than 100 while `io(20_000)` runs, not counting what a snapshot itself allocates
/// (writing the JSON: measured as two snapshots with nothing in between).
#[track_caller]
pub fn assert_serving_allocates_nothing(
    export: &mut MountedExport,
    stats: &Path,
    io: &mut dyn FnMut(u64),
) {
    let snapshot = |export: &mut MountedExport| {
        let _ = fs::remove_file(stats);
        export.signal(libc::SIGUSR1);
        let json = read_stats(stats);
        let requests = json["queue"]["requests"].as_u64().expect("queue.requests");
        (json["allocations"].as_u64().expect("allocations"), requests)
    };
    io(2_000);
    let (idle, _) = snapshot(export);
    let (before, requests_before) = snapshot(export);
    let per_snapshot = before - idle;
    io(20_000);
    let (after, requests_after) = snapshot(export);
    assert!(
        requests_after - requests_before >= 20_000,
        "requests were counted"
    );
    let serving = (after - before).saturating_sub(per_snapshot);
    assert!(
        serving < 100,
        "{serving} allocations for {} requests ({}; {per_snapshot} per snapshot not counted); \
         daemon stderr:\n{}",
        requests_after - requests_before,
        export.dispatch(),
        export.stderr()
    );
}
