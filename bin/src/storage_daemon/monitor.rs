//! The QMP monitor: a unix socket (`--chardev socket,path=...,server=on` + `--monitor`)
//! on a thread of its own, one thread per client. Commands run on the [`Hub`]'s daemon
//! one at a time; the answer is written first, then the events the command caused (as
//! QEMU: `block-export-del` answers, then `BLOCK_EXPORT_DELETED` follows), to every
//! client that negotiated capabilities.

use std::io::{BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corofuse_qsd::qmp::{self, Commands, QmpError, Session, Version, VersionTriple};
use corofuse_qsd::{BlockExport, Blockdev};
use serde_json::{json, Value};

use super::state::Daemon;

/// What the monitor threads and the main thread share.
pub struct Hub {
    pub daemon: Mutex<Daemon>,
    clients: Mutex<Vec<Client>>,
    /// Held by a client's thread from a command to the events it caused, so that no other
    /// client's thread sends those events before the command's answer.
    command: Mutex<()>,
    /// `quit` was asked for.
    pub quit: AtomicBool,
}

struct Client {
    stream: UnixStream,
    negotiated: Arc<AtomicBool>,
}

impl Hub {
    pub fn new(daemon: Daemon) -> Hub {
        Hub {
            daemon: Mutex::new(daemon),
            clients: Mutex::new(Vec::new()),
            command: Mutex::new(()),
            quit: AtomicBool::new(false),
        }
    }

    pub fn daemon(&self) -> std::sync::MutexGuard<'_, Daemon> {
        self.daemon.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends the daemon's queued events to every negotiated client.
    pub fn send_events(&self) {
        let events = std::mem::take(&mut self.daemon().events);
        self.broadcast(events);
    }

    /// Sends `events` to every negotiated client, dropping the clients that are gone.
    pub fn broadcast(&self, events: Vec<(&'static str, Value)>) {
        if events.is_empty() {
            return;
        }
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients.retain_mut(|c| {
            if !c.negotiated.load(Ordering::SeqCst) {
                return true;
            }
            events.iter().all(|(name, data)| {
                let line = format!("{}\r\n", qmp::event(name, data));
                c.stream.write_all(line.as_bytes()).is_ok()
            })
        });
    }
}

/// The version corofuse answers with: the QEMU whose qemu-storage-daemon it stands in for.
pub fn version() -> Version {
    Version {
        qemu: VersionTriple {
            micro: 0,
            minor: 0,
            major: 10,
        },
        package: format!("corofuse {}", env!("CARGO_PKG_VERSION")),
    }
}

/// Listens on `path` (replacing a stale socket file) and serves clients until the process
/// ends.
pub fn listen(path: &str, hub: Arc<Hub>) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).map_err(|e| format!("Failed to bind socket to {path}: {e}"))?;
    std::thread::Builder::new()
        .name("qmp".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let hub = Arc::clone(&hub);
                let _ = std::thread::Builder::new()
                    .name("qmp-client".into())
                    .spawn(move || serve_client(stream, &hub));
            }
        })
        .map_err(|e| format!("starting the monitor thread: {e}"))?;
    Ok(())
}

fn serve_client(stream: UnixStream, hub: &Hub) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let negotiated = Arc::new(AtomicBool::new(false));
    if let Ok(events) = stream.try_clone() {
        let client = Client {
            stream: events,
            negotiated: Arc::clone(&negotiated),
        };
        hub.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(client);
    }
    let greeting = format!("{}\r\n", Session::greeting(&version()));
    if out.write_all(greeting.as_bytes()).is_err() {
        return;
    }
    let mut session = Session::default();
    let messages = serde_json::Deserializer::from_reader(BufReader::new(stream)).into_iter();
    for message in messages {
        // A syntax error ends the stream (it cannot be resynchronised): answer, then close.
        let broken = message.as_ref().is_err_and(|e| !e.is_io());
        if message.as_ref().is_err_and(|e| e.is_io() || e.is_eof()) {
            break;
        }
        let _turn = hub.command.lock().unwrap_or_else(|e| e.into_inner());
        let answer = {
            let mut commands = Runner { hub };
            session.handle_value(message.map_err(|e| e.to_string()), &mut commands)
        };
        negotiated.store(session.negotiated(), Ordering::SeqCst);
        if out.write_all(format!("{answer}\r\n").as_bytes()).is_err() || broken {
            break;
        }
        hub.send_events();
    }
}

/// The commands, run on the hub's daemon.
struct Runner<'a> {
    hub: &'a Hub,
}

/// The commands corofuse answers (`query-commands`).
const COMMANDS: &[&str] = &[
    "qmp_capabilities",
    "query-version",
    "query-commands",
    "blockdev-add",
    "blockdev-del",
    "block-export-add",
    "block-export-del",
    "query-block-exports",
    "query-named-block-nodes",
    "block_resize",
    "blockdev-snapshot-internal-sync",
    "blockdev-snapshot-delete-internal-sync",
    "query-iothreads",
    "quit",
];

impl Commands for Runner<'_> {
    fn run(&mut self, name: &str, arguments: Value) -> Result<Value, QmpError> {
        let ok = |()| json!({});
        match name {
            "query-version" => no_arguments(arguments).map(|()| json!(version())),
            "query-commands" => no_arguments(arguments)
                .map(|()| Value::Array(COMMANDS.iter().map(|c| json!({ "name": c })).collect())),
            "blockdev-add" => {
                let node = Blockdev::parse(arguments, false)?;
                Ok(self.hub.daemon().add_node(node).map(ok)?)
            }
            "blockdev-del" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                let node = f.req_str("node-name")?;
                f.finish()?;
                Ok(self.hub.daemon().del_node(&node).map(ok)?)
            }
            "block-export-add" => {
                let export = BlockExport::parse(arguments, false)?;
                Ok(self.hub.daemon().add_export(export).map(ok)?)
            }
            "block-export-del" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                let id = f.req_str("id")?;
                f.choice("mode", &["safe", "hard"])?;
                f.finish()?;
                Ok(self.hub.daemon().del_export(&id).map(ok)?)
            }
            "query-block-exports" => {
                no_arguments(arguments).map(|()| self.hub.daemon().query_exports())
            }
            "query-named-block-nodes" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                f.bool("flat")?;
                f.finish()?;
                Ok(self.hub.daemon().query_nodes())
            }
            "block_resize" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                let device = f.str("device")?;
                let node = f.str("node-name")?;
                let size = f.int("size")?.ok_or_else(|| f.missing("size"))?;
                f.finish()?;
                let name = node.or(device).unwrap_or_default();
                Ok(self.hub.daemon().resize(&name, size).map(ok)?)
            }
            "blockdev-snapshot-internal-sync" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                let device = f.req_str("device")?;
                let name = f.req_str("name")?;
                f.finish()?;
                Ok(self.hub.daemon().snapshot_create(&device, &name).map(ok)?)
            }
            "blockdev-snapshot-delete-internal-sync" => {
                let mut f = corofuse_qsd::fields::Fields::new(arguments, false)?;
                let device = f.req_str("device")?;
                let id = f.str("id")?;
                let name = f.str("name")?;
                f.finish()?;
                let daemon = self.hub.daemon();
                Ok(daemon.snapshot_delete(&device, id.as_deref(), name.as_deref())?)
            }
            "query-iothreads" => {
                no_arguments(arguments).map(|()| self.hub.daemon().query_iothreads())
            }
            "quit" => no_arguments(arguments).map(|()| {
                self.hub.quit.store(true, Ordering::SeqCst);
                json!({})
            }),
            _ => Err(qmp::not_found(name)),
        }
    }
}

fn no_arguments(arguments: Value) -> Result<(), QmpError> {
    Ok(corofuse_qsd::fields::Fields::new(arguments, false)?.finish()?)
}
