//! Waiting for child processes without ever blocking past a deadline or a Ctrl-C.
//!
//! Why polling: `Child::wait` cannot be interrupted, and a load stuck in a FUSE request
//! (a daemon bug is exactly what the lab may find) would hang the lab with its mounts.
//! Polling every few milliseconds costs nothing next to a run of seconds.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::interrupt;

/// Starts a load process: no stdin, stdout and stderr into `out` and `err`, killed if the
/// lab dies.
pub fn spawn_load(
    cmd: &mut Command,
    out: &Path,
    err: &Path,
) -> Result<std::io::Result<Child>, String> {
    cmd.stdin(Stdio::null())
        .stdout(File::create(out).map_err(|e| format!("{}: {e}", out.display()))?)
        .stderr(File::create(err).map_err(|e| format!("{}: {e}", err.display()))?);
    interrupt::tie_to_lab(cmd, libc::SIGKILL);
    Ok(cmd.spawn())
}

/// How often the waits look again.
pub const POLL: Duration = Duration::from_millis(5);

/// Waits for `child` until `timeout`; kills it (SIGKILL) on timeout or interruption.
pub fn wait(child: &mut Child, timeout: Duration, what: &str) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("waiting for {what}: {e}"))?
        {
            return Ok(status);
        }
        let why = if interrupt::requested() {
            "interrupted; cleaned up".to_string()
        } else if Instant::now() >= deadline {
            format!("{what} did not finish within {timeout:?}; killed it")
        } else {
            std::thread::sleep(POLL);
            continue;
        };
        let _ = child.kill();
        let _ = child.wait();
        return Err(why);
    }
}

/// Sends `sig` to a child that has not been reaped (so its PID cannot have been reused).
pub fn signal(child: &Child, sig: libc::c_int) -> std::io::Result<()> {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) touches no memory; `pid` is our unreaped child.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The last `lines` lines of a log file, indented, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    if start == all.len() {
        return "(no output)".into();
    }
    all[start..]
        .iter()
        .map(|l| format!("\n    {l}"))
        .collect::<String>()
}

/// SIGTERM, wait up to `timeout`, then SIGKILL and wait: the exit status when the child
/// exited by itself; what went wrong or had to be forced goes into `problems`.
pub fn terminate(
    c: &mut Child,
    timeout: Duration,
    problems: &mut Vec<String>,
) -> Option<ExitStatus> {
    if let Err(e) = signal(c, libc::SIGTERM) {
        problems.push(format!("SIGTERM failed: {e}"));
    }
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match c.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(POLL),
            Err(_) => break,
        }
    }
    problems.push(format!("no exit within {timeout:?} of SIGTERM: killed"));
    let _ = c.kill();
    let _ = c.wait();
    None
}

/// Removes `path` if it is there (a pidfile, a socket a server left).
pub fn remove_if_present(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("cannot remove {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}
