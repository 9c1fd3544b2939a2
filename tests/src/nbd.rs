//! NBD servers for the NBD backend's tests: [`NbdServer`] runs qemu-nbd or nbdkit on a unix
//! socket or a loopback TCP port and gives the URI to reach it.
//!
//! Like [`Qsd`](crate::qemu::Qsd), a server never outlives its test: Drop sends SIGTERM to
//! the PID it started (SIGKILL if it hangs), and the server also gets SIGTERM if the
//! starting thread dies (`PR_SET_PDEATHSIG`). It is up once it has written its pidfile
//! (both servers write it after they listen).

use std::fs::{self, File};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::export::TIMEOUT;
use crate::sys;

/// How the server listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A unix socket in the server's scratch directory.
    Unix,
    /// A free TCP port on 127.0.0.1.
    Tcp,
}

/// A live NBD server, stopped by PID on drop.
pub struct NbdServer {
    child: Child,
    scratch: TempDir,
    uri: String,
    tool: &'static str,
    /// The command line, to start the same server again ([`NbdServer::restart`]).
    argv: Vec<std::ffi::OsString>,
}

impl NbdServer {
    /// `qemu-nbd -f FORMAT -x NAME --persistent --shared=16 [ARGS] IMAGE`.
    pub fn qemu_nbd(image: &Path, format: &str, name: &str, via: Via, args: &[&str]) -> NbdServer {
        let mut command = Command::new("qemu-nbd");
        command.args(["-f", format, "-x", name, "--persistent", "--shared=16"]);
        command.args(args);
        Self::start("qemu-nbd", command, name, via, |c, pidfile, listen| {
            c.arg(format!("--pid-file={}", pidfile.display()));
            match listen {
                Listen::Unix(sock) => c.arg(format!("--socket={}", sock.display())),
                Listen::Tcp(port) => c.args(["-b", "127.0.0.1", "-p", &port.to_string()]),
            };
            c.arg(image);
        })
    }

    /// `nbdkit -f [ARGS]` (plugin, its parameters and `--filter=`s in ARGS); the export
    /// name is ignored by most plugins, so it is "" here.
    pub fn nbdkit(via: Via, args: &[&str]) -> NbdServer {
        let command = Command::new("nbdkit");
        Self::start("nbdkit", command, "", via, |c, pidfile, listen| {
            c.args(["-f", "-P"]).arg(pidfile);
            match listen {
                Listen::Unix(sock) => c.arg("-U").arg(sock),
                Listen::Tcp(port) => c.args(["-i", "127.0.0.1", "-p", &port.to_string()]),
            };
            c.args(args);
        })
    }

    fn start(
        tool: &'static str,
        mut command: Command,
        name: &str,
        via: Via,
        finish: impl FnOnce(&mut Command, &Path, Listen<'_>),
    ) -> NbdServer {
        let scratch = tempfile::Builder::new()
            .prefix("corofuse-nbd-")
            .tempdir()
            .expect("temp dir");
        let (pidfile, socket) = (scratch.path().join("pid"), scratch.path().join("sock"));
        let (listen, uri) = match via {
            Via::Unix => (
                Listen::Unix(&socket),
                format!("nbd+unix:///{name}?socket={}", socket.display()),
            ),
            Via::Tcp => {
                let port = free_port();
                (Listen::Tcp(port), format!("nbd://127.0.0.1:{port}/{name}"))
            }
        };
        finish(&mut command, &pidfile, listen);
        let mut argv = vec![command.get_program().to_owned()];
        argv.extend(command.get_args().map(|a| a.to_owned()));
        let child = spawn(tool, &argv, scratch.path());
        let mut server = NbdServer {
            child,
            scratch,
            uri,
            tool,
            argv,
        };
        server.wait_up(&pidfile);
        server
    }

    /// SIGKILLs the server (if it still runs) and starts it again with the same command
    /// line, on the same socket or port; returns once it listens.
    pub fn restart(&mut self) {
        self.kill();
        let pidfile = self.scratch.path().join("pid");
        let _ = fs::remove_file(&pidfile);
        // A killed nbdkit leaves its socket file, and refuses to start over it.
        let _ = fs::remove_file(self.scratch.path().join("sock"));
        self.child = spawn(self.tool, &self.argv, self.scratch.path());
        self.wait_up(&pidfile);
    }

    fn wait_up(&mut self, pidfile: &Path) {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}): {}", self.tool, self.stderr());
            }
            if fs::read_to_string(pidfile).is_ok_and(|s| !s.trim().is_empty()) {
                return;
            }
            if start.elapsed() > TIMEOUT {
                panic!("{} not up after {TIMEOUT:?}: {}", self.tool, self.stderr());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The URI that reaches the export.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The server's PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.scratch.path().join("stderr")).unwrap_or_default()
    }

    /// SIGKILLs the server now (a server that dies under its clients) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and waits for the exit (SIGKILL after a timeout): what Drop does.
    pub fn stop(&mut self) {
        crate::qemu::terminate(&mut self.child, self.tool);
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `argv` with its stderr appended to `scratch`/stderr, SIGTERMed if we die.
fn spawn(tool: &str, argv: &[std::ffi::OsString], scratch: &Path) -> Child {
    let stderr = File::options()
        .create(true)
        .append(true)
        .open(scratch.join("stderr"))
        .expect("stderr file");
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe { command.pre_exec(sys::term_with_parent) };
    command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {tool}: {e}"))
}

enum Listen<'a> {
    Unix(&'a Path),
    Tcp(u16),
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}
