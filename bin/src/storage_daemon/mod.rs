//! `corofuse storage-daemon ARGS...`, and the binary run as `qemu-storage-daemon`:
//! qemu-storage-daemon's command line and QMP monitor over corofuse's exports, so that a
//! script written for qsd runs unchanged.
//!
//! Order of events, as qsd: the options are applied in the order given (a node before its
//! export); any error is one line "PROG: OPTION: sentence" with exit status 1, and the
//! exports already made are removed first. Then the pidfile, `READY=1` to the service
//! manager, and with `--daemonize` the parent exits 0. Nothing is printed while all is
//! well. SIGINT/SIGTERM or QMP `quit`: the event `SHUTDOWN`, every export stopped (closed
//! before its mount goes), the pidfile removed, exit 0.

mod daemonize;
mod monitor;
mod open;
mod state;

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use corofuse_qsd::cli::{self, Kind};
use corofuse_qsd::{keyval, BlockExport, Blockdev, Chardev, Monitor, Object};
use serde_json::json;

use crate::pidfile::PidFile;
use crate::signals::SignalFd;
use monitor::Hub;
use state::Daemon;

/// Runs the daemon: `prog` is the name errors start with, `args` what follows it.
pub fn run(prog: &str, args: &[String]) -> ExitCode {
    let options = match cli::parse(args) {
        Ok(options) => options,
        Err(e) => return fail(prog, &e),
    };
    if options.iter().any(|o| o.kind == Kind::Help) {
        print!("{}", cli::HELP);
        return ExitCode::SUCCESS;
    }
    if options.iter().any(|o| o.kind == Kind::Version) {
        println!(
            "qemu-storage-daemon version 10.0.0 (corofuse {})",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    // Before any thread starts, so that every thread has the signals blocked.
    let signals = match SignalFd::new() {
        Ok(s) => s,
        Err(e) => return fail(prog, &format!("signalfd: {e}")),
    };
    let parent = match options.iter().any(|o| o.kind == Kind::Daemonize) {
        true => match daemonize::fork() {
            Ok(d) => Some(d),
            Err(e) => return fail(prog, &format!("--daemonize: {e}")),
        },
        false => None,
    };
    let stats = options
        .iter()
        .rev()
        .find(|o| o.kind == Kind::Stats)
        .map(|o| std::path::PathBuf::from(&o.value));
    if let Some(path) = &stats {
        if let Err(e) = crate::pidfile::check_writable("--stats", path) {
            return fail(prog, &e);
        }
    }
    let hub = Arc::new(Hub::new(Daemon::new(stats.is_some())));
    let pidfile = match apply(&options, &hub) {
        Ok(pidfile) => pidfile,
        Err(e) => {
            hub.daemon().shutdown();
            return fail(prog, &e);
        }
    };
    // Removed at exit (if it still holds this daemon's PID), as `corofuse mount`'s.
    let _pidfile = match pidfile.as_deref().map(PidFile::write).transpose() {
        Ok(pidfile) => pidfile,
        Err(e) => {
            hub.daemon().shutdown();
            return fail(prog, &format!("cannot create PID file: {e}"));
        }
    };
    notify_ready();
    if let Some(parent) = parent {
        parent.started();
    }
    serve(&hub, &signals, stats.as_deref());
    ExitCode::SUCCESS
}

/// Applies the options in order; returns the pidfile's path. The error says which option.
fn apply(options: &[cli::Arg], hub: &Arc<Hub>) -> Result<Option<std::path::PathBuf>, String> {
    let mut chardevs: Vec<Chardev> = Vec::new();
    let mut pidfile = None;
    // Held until every option is applied: as in qsd, whose monitor runs only once the
    // command line is done, a QMP client that connects early (the socket is bound at
    // `--monitor`) sees every node and export the command line makes.
    let mut daemon = hub.daemon();
    for option in options {
        let at = |e: String| format!("{}: {e}", option.shown);
        let value = &option.value;
        match option.kind {
            Kind::Blockdev => {
                let (tree, kv) = keyval::parse_option(value, Some("driver")).map_err(at)?;
                let node = Blockdev::parse(tree, kv).map_err(at)?;
                daemon.add_node(node).map_err(at)?;
            }
            Kind::Export => {
                let (tree, kv) = keyval::parse_option(value, Some("type")).map_err(at)?;
                let export = BlockExport::parse(tree, kv).map_err(at)?;
                daemon.add_export(export).map_err(at)?;
            }
            Kind::Object => {
                let (tree, kv) = keyval::parse_option(value, Some("qom-type")).map_err(at)?;
                let object = Object::parse(tree, kv).map_err(at)?;
                daemon.add_object(object).map_err(at)?;
            }
            Kind::Chardev => {
                let tree = keyval::parse(value, Some("backend")).map_err(at)?;
                chardevs.push(Chardev::parse(tree).map_err(at)?);
            }
            Kind::Monitor => {
                let tree = keyval::parse(value, Some("chardev")).map_err(at)?;
                let monitor = Monitor::parse(tree).map_err(at)?;
                let chardev = chardevs
                    .iter()
                    .find(|c| c.id == monitor.chardev)
                    .ok_or_else(|| at(format!("chardev \"{}\" not found", monitor.chardev)))?;
                monitor::listen(&chardev.path, Arc::clone(hub)).map_err(at)?;
            }
            Kind::NbdServer => {
                return Err(at(
                    "corofuse serves FUSE exports only: --nbd-server is not supported".into(),
                ))
            }
            Kind::Trace => {
                return Err(at(
                    "tracing is not supported by corofuse (drop -T/--trace)".into()
                ))
            }
            Kind::Pidfile => pidfile = Some(value.into()),
            Kind::Daemonize | Kind::Help | Kind::Version | Kind::Stats => {}
        }
    }
    Ok(pidfile)
}

/// Until SIGINT/SIGTERM or `quit`: exports unmounted from outside are reaped (with their
/// events), SIGUSR1 writes `--stats`; then `SHUTDOWN`, `--stats` written a last time,
/// and every export stopped.
fn serve(hub: &Hub, signals: &SignalFd, stats: Option<&std::path::Path>) {
    let write_stats = || {
        if let Some(path) = stats {
            let doc = hub.daemon().stats();
            crate::out_file::write_stats(path, &doc);
        }
    };
    let reason = loop {
        if hub.quit.load(Ordering::SeqCst) {
            break "host-qmp-quit";
        }
        match crate::signals::wait_signal(signals, 50) {
            Some(libc::SIGUSR1) => write_stats(),
            None => {}
            Some(_) => break "host-signal",
        }
        // Only the exports this loop reaped: the events a command queued are sent by its
        // monitor thread after the command's answer (QEMU's order; sent from here, they
        // went first when this ran in between).
        let reaped = hub.daemon().reap();
        hub.broadcast(reaped);
    };
    write_stats();
    hub.broadcast(vec![(
        "SHUTDOWN",
        json!({"guest": false, "reason": reason}),
    )]);
    hub.daemon().shutdown();
    hub.send_events();
}

/// `READY=1` to the service manager (`Type=notify`), if `NOTIFY_SOCKET` names one.
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_notify(&path, b"READY=1") {
        log::warn!("sd_notify READY=1 to {path:?}: {e}");
    }
}

/// One datagram to the socket `path` (a leading `@` names an abstract socket).
fn send_notify(path: &std::ffi::OsStr, message: &[u8]) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(path)?,
    };
    UnixDatagram::unbound()?.send_to_addr(message, &addr)?;
    Ok(())
}

fn fail(prog: &str, message: &str) -> ExitCode {
    eprintln!("{prog}: {message}");
    ExitCode::FAILURE
}
