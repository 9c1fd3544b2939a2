//! The `nbd` row's server: qemu-nbd serving the storage image on a unix socket in the
//! lab's scratch directory, started before every run of the row and stopped after it.
//!
//! Why these options: the row measures NBD clients (corofuse's `nbd+unix://` backend,
//! qemu-storage-daemon's `driver=nbd`, and fio's nbd engine as the limit) against one
//! server, which should cost what qsd's own `file` node costs on the `disk` row: `-f raw`,
//! `--cache=writeback` (buffered, the page cache, as `disk`) and `--aio=io_uring` (qsd's
//! `aio=io_uring`). `--persistent` keeps it up between the clients' connections (fio's
//! jobs connect and leave), `--shared=0` lets any number connect (one per corofuse loop:
//! qemu-nbd then advertises `CAN_MULTI_CONN`), `-x ''` names the default export, which the
//! URIs `nbd+unix:///?socket=SOCK` ask for.
//!
//! # Cleanup contract
//! [`QemuNbd`] owns the child: `Drop` (so every error path and Ctrl-C) sends SIGTERM to
//! its PID, waits up to [`STOP_TIMEOUT`], then SIGKILLs it and removes the socket. It runs
//! in its own process group (a Ctrl-C reaches only the lab) with `PR_SET_PDEATHSIG`
//! (SIGTERM) for a lab killed with SIGKILL, as the export daemons do.

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{child, interrupt};

/// The binary on the PATH.
pub const PROGRAM: &str = "qemu-nbd";

/// How long qemu-nbd may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long qemu-nbd may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Its first line of `--version`, or an error saying how to install it.
pub fn version() -> Result<String, String> {
    crate::child::version_line(PROGRAM, |e| {
        format!("{PROGRAM} cannot run ({e}), and the nbd row needs it: apt-get install qemu-utils")
    })
}

/// The URI of the default export on `socket`, as corofuse, qsd's docs and fio spell it.
pub fn uri(socket: &Path) -> String {
    format!("nbd+unix:///?socket={}", socket.display())
}

/// The qemu-nbd command line serving the raw `image` on `socket` (module docs).
pub fn command(image: &Path, socket: &Path) -> Command {
    let mut cmd = Command::new(PROGRAM);
    cmd.args(["-f", "raw", "--socket"])
        .arg(socket)
        .args(["--persistent", "--shared=0", "-x", ""])
        .args(["--cache=writeback", "--aio=io_uring"])
        .arg(image);
    cmd
}

/// A running qemu-nbd, stopped when dropped.
pub struct QemuNbd {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl QemuNbd {
    /// Starts qemu-nbd on `image` and waits until `socket` accepts connections.
    pub fn start(image: &Path, socket: &Path, log: &Path) -> Result<QemuNbd, String> {
        child::remove_if_present(socket)?;
        let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = command(image, socket);
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out)
            .process_group(0);
        interrupt::tie_to_lab(&mut cmd, libc::SIGTERM);
        let child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start {PROGRAM}: {e} (the nbd row needs it: apt-get install qemu-utils)"
            )
        })?;
        let mut server = QemuNbd {
            child: Some(child),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        };
        server.wait_listening()?;
        Ok(server)
    }

    /// The URI its clients connect to.
    pub fn uri(&self) -> String {
        uri(&self.socket)
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Polls until a connection is accepted (the socket file appears at bind(2), before
    /// listen(2)); the probe leaves at once, which `--persistent` survives.
    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "{PROGRAM} exited ({status}) before listening; its log:{}",
                        child::tail(&self.log, 10)
                    ));
                }
            }
            interrupt::check()?;
            if Instant::now() >= deadline {
                return Err(format!(
                    "{PROGRAM} did not listen on {} within {START_TIMEOUT:?}; its log:{}",
                    self.socket.display(),
                    child::tail(&self.log, 10)
                ));
            }
            std::thread::sleep(child::POLL);
        }
    }

    /// Stops it (module docs). Idempotent; an error says what had to be forced.
    pub fn stop(&mut self) -> Result<(), String> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let mut problems = Vec::new();
        match c.try_wait() {
            Ok(Some(status)) => problems.push(format!("it had already exited ({status})")),
            _ => drop(child::terminate(&mut c, STOP_TIMEOUT, &mut problems)),
        }
        if let Err(e) = child::remove_if_present(&self.socket) {
            problems.push(e);
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "stopping {PROGRAM} (pid {}): {}; its log:{}",
                c.id(),
                problems.join("; "),
                child::tail(&self.log, 10)
            )),
        }
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("corofuse bench: warning: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_mirrors_qsd_file_node() {
        let cmd = command(Path::new("/s/i.raw"), Path::new("/m/nbd.sock"));
        assert_eq!(cmd.get_program(), PROGRAM);
        let args = crate::child::args_of(&cmd);
        assert_eq!(
            args,
            [
                "-f",
                "raw",
                "--socket",
                "/m/nbd.sock",
                "--persistent",
                "--shared=0",
                "-x",
                "",
                "--cache=writeback",
                "--aio=io_uring",
                "/s/i.raw"
            ]
        );
        assert_eq!(
            uri(Path::new("/m/nbd.sock")),
            "nbd+unix:///?socket=/m/nbd.sock"
        );
    }
}
