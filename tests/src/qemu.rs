//! QEMU's own programs against an image: [`qemu`] runs qemu-img or qemu-io to completion,
//! [`Qsd`] is a qemu-storage-daemon that holds an image open for writing until dropped.
//!
//! Like [`MountedExport`](crate::MountedExport), a [`Qsd`] never outlives its test: Drop
//! sends SIGTERM to the PID it started, SIGKILLs it if it hangs, and the daemon also gets
//! SIGTERM if the starting thread dies (`PR_SET_PDEATHSIG`).

use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::export::TIMEOUT;
use crate::require::note;
use crate::sys;

/// The name of qemu-storage-daemon's binary.
pub const QSD: &str = "qemu-storage-daemon";

/// Runs `tool ARGS...` (qemu-img, qemu-io) to completion, output captured.
pub fn qemu<S: AsRef<OsStr>>(tool: &str, args: &[S]) -> Output {
    Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {tool}: {e}"))
}

/// What a finished run printed, for assertion messages: status, stdout and stderr.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A live qemu-storage-daemon exporting an image writable over NBD (on a unix socket of
/// its own), so that it holds QEMU's writer locks on the image.
pub struct Qsd {
    child: Child,
    /// The pidfile, the socket and the daemon's stderr.
    scratch: TempDir,
}

impl Qsd {
    /// Starts the daemon on `image` and waits until it has written its pidfile (after its
    /// exports are set up). If it exits first, returns its stderr.
    pub fn export_writable(image: &Path) -> Result<Qsd, String> {
        let scratch = tempfile::Builder::new()
            .prefix("corofuse-qsd-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let (pidfile, socket) = (scratch.path().join("pid"), scratch.path().join("sock"));
        let stderr = File::create(scratch.path().join("stderr")).map_err(|e| e.to_string())?;
        // QEMU's option syntax doubles a comma inside a value.
        let quote = |p: &Path| p.display().to_string().replace(',', ",,");
        let mut command = Command::new(QSD);
        command
            .arg("--blockdev")
            .arg(format!("driver=file,node-name=f,filename={}", quote(image)))
            .args(["--blockdev", "driver=raw,node-name=r,file=f"])
            .arg("--nbd-server")
            .arg(format!("addr.type=unix,addr.path={}", quote(&socket)))
            .args(["--export", "type=nbd,id=e,node-name=r,writable=on"])
            .arg("--pidfile")
            .arg(&pidfile)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
        unsafe { command.pre_exec(sys::term_with_parent) };
        let child = command.spawn().map_err(|e| format!("spawn {QSD}: {e}"))?;
        let mut qsd = Qsd { child, scratch };
        let start = Instant::now();
        let pid = qsd.pid().to_string();
        loop {
            if let Ok(Some(status)) = qsd.child.try_wait() {
                return Err(format!("{QSD} exited ({status}): {}", qsd.stderr()));
            }
            if fs::read_to_string(&pidfile).is_ok_and(|s| s.trim() == pid) {
                return Ok(qsd);
            }
            if start.elapsed() > TIMEOUT {
                return Err(format!("{QSD} not up after {TIMEOUT:?}: {}", qsd.stderr()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The daemon's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.scratch.path().join("stderr")).unwrap_or_default()
    }
}

impl Drop for Qsd {
    fn drop(&mut self) {
        terminate(&mut self.child, QSD);
    }
}

/// Ends the server `child` that a test started: SIGTERM, a wait up to [`TIMEOUT`], then
/// SIGKILL with a note naming `tool`; a child that has exited already is only reaped.
pub fn terminate(child: &mut Child, tool: &str) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = sys::kill(child.id(), libc::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < TIMEOUT {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    note(&format!(
        "{tool} (pid {}) ignored SIGTERM for {TIMEOUT:?}: SIGKILL",
        child.id()
    ));
    let _ = child.kill();
    let _ = child.wait();
}
