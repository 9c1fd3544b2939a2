//! [`Daemon`]: the nodes, objects and exports of one storage daemon, changed by the
//! command line at start and by QMP while it serves. The nodes and exports are the
//! model's ([`crate::model::Model`], the one `corofuse mount` builds too): each node
//! declared here is resolved into the model's node when added, each export added there,
//! so adding or removing one leaves the others serving. What stays here is qsd's own:
//! the declarations as given (for its queries), iothreads, TLS objects, events.
//!
//! The exports share one set of event loops ([`server::LoopSet`]), as qsd's exports share
//! its iothreads: each `--object iothread` is a loop of its own (unpinned, as qsd's
//! iothreads; its `poll-max-ns` the loop's polling), and an export runs on the loops its
//! `iothread`/`iothread.N` keys name, or on the default loops (made at the first export
//! that names none: as many, pinned the same way, as `corofuse mount` would use).

use std::collections::BTreeMap;
use std::io;

use corofuse_qsd::{AllowOther, Backing, BlockExport, Blockdev, Child, Driver, Object};
use serde_json::{json, Value};
use server::{LoopSet, Report, ServeOptions};

use super::open::reason;
use crate::model::{ExportError, ExportSpec, Model};

/// An `--object iothread`: its loop in the daemon's set.
struct Iothread {
    id: String,
    poll_max_ns: Option<u64>,
    at: usize,
}

/// Everything the daemon has.
pub struct Daemon {
    /// The nodes as declared (`--blockdev`, `blockdev-add`).
    nodes: BTreeMap<String, Blockdev>,
    model: Model,
    /// The exports as declared, by id.
    info: BTreeMap<String, BlockExport>,
    iothreads: Vec<Iothread>,
    /// The loops of the exports that name no iothread (made at the first).
    default_loops: Vec<usize>,
    /// Per-request accounting, for `--stats`.
    accounting: bool,
    tls: BTreeMap<String, String>,
    /// Events to send once the current command's answer is out: (name, data).
    pub events: Vec<(&'static str, Value)>,
}

impl Daemon {
    /// A daemon with nothing yet; `accounting` times every request per opcode (`--stats`).
    pub fn new(accounting: bool) -> Daemon {
        Daemon {
            nodes: BTreeMap::new(),
            model: Model::new(LoopSet::named("qsd-loop")),
            info: BTreeMap::new(),
            iothreads: Vec::new(),
            default_loops: Vec::new(),
            accounting,
            tls: BTreeMap::new(),
            events: Vec::new(),
        }
    }

    /// A loop's runtime: polling up to `poll_ns`, accounting if `--stats`.
    fn loop_config(&self, poll_ns: u64) -> runtime::Config {
        runtime::Config {
            poll_ns,
            account: self.accounting,
            ..runtime::Config::default()
        }
    }

    /// `--object`.
    pub fn add_object(&mut self, object: Object) -> Result<(), String> {
        let id = object.id().to_string();
        let taken = self.iothreads.iter().any(|t| t.id == id) || self.tls.contains_key(&id);
        if taken {
            return Err(format!(
                "attempt to add duplicate property '{id}' to object (type 'container')"
            ));
        }
        match object {
            Object::Iothread { id, poll_max_ns } => {
                let config = self.loop_config(poll_max_ns.unwrap_or(0));
                let at = self.model.loops().add_loop(None, config).map_err(|e| {
                    format!("cannot create iothread '{id}': starting its event loop: {e}")
                })?;
                self.iothreads.push(Iothread {
                    id,
                    poll_max_ns,
                    at,
                });
            }
            Object::TlsCredsX509 { id, dir, .. } => {
                let ca = format!("{dir}/ca-cert.pem");
                std::fs::metadata(&ca)
                    .map_err(|e| format!("Unable to access credentials {ca}: {}", reason(&e)))?;
                self.tls.insert(id, dir);
            }
        }
        Ok(())
    }

    fn graph(&self) -> crate::storage_daemon::open::Graph<'_> {
        crate::storage_daemon::open::Graph {
            nodes: &self.nodes,
            tls: &self.tls,
        }
    }

    /// `--blockdev`, `blockdev-add`.
    pub fn add_node(&mut self, node: Blockdev) -> Result<(), String> {
        let name = node
            .node_name
            .clone()
            .ok_or("'node-name' must be specified for the root node")?;
        if self.nodes.contains_key(&name) {
            return Err(format!("Duplicate nodes with node-name='{name}'"));
        }
        self.graph().check(&node)?;
        let resolved = self.graph().resolve(&node)?;
        self.model.add_node(&name, resolved)?;
        self.nodes.insert(name, node);
        Ok(())
    }

    /// `blockdev-del`.
    pub fn del_node(&mut self, name: &str) -> Result<(), String> {
        self.model.del_node(name)?;
        self.nodes.remove(name);
        Ok(())
    }

    /// `--export`, `block-export-add`: the mount is live on return.
    pub fn add_export(&mut self, export: BlockExport) -> Result<(), String> {
        let mut spec = ExportSpec {
            id: export.id.clone(),
            node: export.node_name.clone(),
            mountpoint: export.mountpoint.clone().into(),
            name: export.node_name.clone(),
            writable: export.writable,
            growable: export.growable,
            passthrough: false,
            serve: self.serve_options(&export),
            loops: None,
        };
        self.model.check_export(&spec)?;
        if let Some(missing) = export
            .iothreads
            .iter()
            .find(|id| !self.iothreads.iter().any(|t| t.id == **id))
        {
            return Err(format!("iothread \"{missing}\" not found"));
        }
        if let Err(e) = std::fs::metadata(&export.mountpoint) {
            let reason = reason(&e);
            return Err(format!("Failed to stat '{}': {reason}", export.mountpoint));
        }
        spec.loops = Some(self.loops_for(&export)?);
        self.model.add_export(&spec).map_err(|e| match e {
            ExportError::Open(e) => {
                super::open::open_error(&self.nodes[&export.node_name], &self.graph(), &e)
            }
            ExportError::Refused(e) => e,
        })?;
        self.info.insert(export.id.clone(), export);
        Ok(())
    }

    /// The loops `export` runs on: its iothreads', else the default loops (made now if
    /// this is the first export that needs them).
    fn loops_for(&mut self, export: &BlockExport) -> Result<Vec<usize>, String> {
        if !export.iothreads.is_empty() {
            let at = |id: &String| self.iothreads.iter().find(|t| t.id == *id).map(|t| t.at);
            return Ok(export.iothreads.iter().filter_map(at).collect());
        }
        if self.default_loops.is_empty() {
            let allowed = runtime::affinity::allowed_cpus().unwrap_or_default();
            let (n, cpus) = ServeOptions::default().plan_loops(allowed);
            let config = self.loop_config(0);
            self.default_loops = (self.model.loops())
                .add_loops(n, &cpus, &config)
                .map_err(|e| format!("starting an event loop: {e}"))?;
        }
        Ok(self.default_loops.clone())
    }

    /// `allow-other`: `auto` is on as root (where the mount always may), off otherwise.
    fn allow_other(&self, export: &BlockExport) -> bool {
        match export.allow_other {
            AllowOther::On => true,
            AllowOther::Off => false,
            // SAFETY: geteuid(2) cannot fail and touches no memory.
            AllowOther::Auto => (unsafe { libc::geteuid() }) == 0,
        }
    }

    /// The export's serving: as `corofuse mount`'s defaults; its loops (and their
    /// polling) are the set's.
    fn serve_options(&self, export: &BlockExport) -> ServeOptions {
        ServeOptions {
            allow_other: self.allow_other(export),
            accounting: self.accounting,
            ..ServeOptions::default()
        }
    }

    /// `block-export-del`: the mount is gone (and the image free) on return; the event
    /// `BLOCK_EXPORT_DELETED` is queued.
    pub fn del_export(&mut self, id: &str) -> Result<(), String> {
        let Some(export) = self.info.remove(id) else {
            return Err(format!("Export '{id}' is not found"));
        };
        if let Some(served) = self.model.remove_export(&export.id) {
            if let Err(e) = served.result {
                log::warn!("export '{id}': {e}");
            }
        }
        self.events
            .push(("BLOCK_EXPORT_DELETED", json!({ "id": id })));
        Ok(())
    }

    /// Exports unmounted from outside: removed; their events, for the caller to send.
    /// Not queued with the commands' events: a command's events follow its answer, and
    /// the main thread reaping between a command and its answer would send them first.
    pub fn reap(&mut self) -> Vec<(&'static str, Value)> {
        let mut events = Vec::new();
        for (id, served) in self.model.reap() {
            if let Err(e) = served.result {
                log::warn!("export '{id}': {e}");
            }
            self.info.remove(&id);
            events.push(("BLOCK_EXPORT_DELETED", json!({ "id": id })));
        }
        events
    }

    /// Every export stopped, in id order, each closed before its mount goes.
    pub fn shutdown(&mut self) {
        let ids: Vec<String> = self.info.keys().cloned().collect();
        for id in ids {
            let _ = self.del_export(&id);
        }
    }

    /// `query-block-exports`.
    pub fn query_exports(&self) -> Value {
        let list: Vec<Value> = self
            .info
            .values()
            .map(|e| {
                json!({"type": "fuse", "id": e.id, "node-name": e.node_name, "shutting-down": false})
            })
            .collect();
        Value::Array(list)
    }

    /// `query-named-block-nodes`: the members scripts read.
    pub fn query_nodes(&self) -> Value {
        let list: Vec<Value> = self
            .nodes
            .iter()
            .map(|(name, node)| {
                let size = self.size_of(name);
                json!({
                    "node-name": name,
                    "drv": node.driver_name(),
                    "ro": node.read_only,
                    "encrypted": false,
                    "detect_zeroes": "off",
                    "backing_file_depth": 0,
                    "cache": {"no-flush": false, "direct": node.cache_direct, "writeback": true},
                    "image": {"virtual-size": size, "format": node.driver_name()},
                })
            })
            .collect();
        Value::Array(list)
    }

    /// A node's size (0 if it would not open).
    fn size_of(&self, name: &str) -> u64 {
        self.model.size_of(name).unwrap_or(0)
    }

    /// `block_resize`: the node's backend resized; an export's file follows.
    pub fn resize(&mut self, name: &str, size: u64) -> Result<(), String> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| format!("Cannot find device='' nor node-name='{name}'"))?;
        if let corofuse_qsd::Driver::Null { .. } = node.driver {
            return Err("Image format driver does not support resize".into());
        }
        self.model.resize(name, size).map_err(|e| match e {
            ExportError::Open(e) => super::open::open_error(node, &self.graph(), &e),
            ExportError::Refused(e) => e,
        })
    }

    /// `blockdev-snapshot-internal-sync`: an internal snapshot of root node `device`,
    /// made while its exports serve. Errors in qsd's words and order.
    pub fn snapshot_create(&self, device: &str, name: &str) -> Result<(), String> {
        let node = self.snapshot_node(device)?;
        let backend = self.model.backend_of(device).map_err(|e| e.to_string())?;
        match backend.snapshot_create(&runtime::Ctx::Blocking, name) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                Err(format!("Device '{device}' is read only"))
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => Err(format!(
                "Block format '{}' used by device '{device}' does not support internal \
                 snapshots",
                node.driver_name()
            )),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(format!("{e} on device '{device}'"))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// `blockdev-snapshot-delete-internal-sync`: deletes the snapshot of `device` with ID
    /// `id` and/or name `name`, and answers what it was, as qsd.
    pub fn snapshot_delete(
        &self,
        device: &str,
        id: Option<&str>,
        name: Option<&str>,
    ) -> Result<Value, String> {
        self.snapshot_node(device)?;
        let backend = self.model.backend_of(device).map_err(|e| e.to_string())?;
        match backend.snapshot_delete(&runtime::Ctx::Blocking, id, name) {
            Ok(s) => {
                let mut info = json!({
                    "id": s.id,
                    "name": s.name,
                    "vm-state-size": s.vm_state_size,
                    "date-sec": s.date_sec,
                    "date-nsec": s.date_nsec,
                    "vm-clock-sec": s.vm_clock_nsec / 1_000_000_000,
                    "vm-clock-nsec": s.vm_clock_nsec % 1_000_000_000,
                });
                if let Some(icount) = s.icount {
                    info["icount"] = json!(icount);
                }
                Ok(info)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => {
                Err("Failed to get a snapshot list: Operation not supported".into())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(format!("{e} on device '{device}'"))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The declared node a snapshot command names: it exists and is a root (no other
    /// node has it as its `file` or `backing`).
    fn snapshot_node(&self, device: &str) -> Result<&Blockdev, String> {
        let node = (self.nodes.get(device))
            .ok_or_else(|| format!("Cannot find device='{device}' nor node-name='{device}'"))?;
        let names_it = |child: &Child| matches!(child, Child::Name(n) if n == device);
        let is_child = self.nodes.values().any(|n| match &n.driver {
            Driver::Raw { file } => names_it(file),
            Driver::Qcow2 { file, backing } => {
                names_it(file) || matches!(backing, Backing::Node(b) if names_it(b))
            }
            _ => false,
        });
        if is_child {
            return Err("Need a root block node".into());
        }
        Ok(node)
    }

    /// `query-iothreads`.
    pub fn query_iothreads(&self) -> Value {
        let list: Vec<Value> = self
            .iothreads
            .iter()
            .map(|t| json!({"id": t.id, "thread-id": std::process::id(), "poll-max-ns": t.poll_max_ns.unwrap_or(0), "poll-grow": 0, "poll-shrink": 0, "aio-max-batch": 0}))
            .collect();
        Value::Array(list)
    }

    /// The `--stats` document: the loops' runtime counters summed, the exports' queues
    /// summed, and a section `export:ID` per export with its node, mount point, loops,
    /// queues, per-opcode accounting, placement and backend counters.
    pub fn stats(&self) -> daemon_stats::Stats {
        let mut doc = daemon_stats::Stats {
            image: "qemu-storage-daemon".into(),
            dispatch: "coroutine (loops shared by the exports)".into(),
            allocations: crate::alloc_count::allocations(),
            ..daemon_stats::Stats::default()
        };
        for counters in self
            .model
            .loops()
            .counters(std::time::Duration::from_secs(1))
        {
            doc.runtime.add(&counters);
        }
        for (id, export) in &self.info {
            let report = self.model.snapshot(id).unwrap_or_default();
            doc.queue.add(&report.queue);
            let sections = (self.model.export(id))
                .map(|served| crate::model::sections(served.fs()))
                .unwrap_or_default();
            let loops = self.model.loops_of(id);
            let section = export_section(export, loops, &report, sections.get("backend"));
            doc.sections.insert(format!("export:{id}"), section);
        }
        doc
    }
}

/// One export's `--stats` section.
fn export_section(
    export: &BlockExport,
    loops: &[usize],
    report: &Report,
    backend: Option<&Value>,
) -> Value {
    json!({
        "node-name": export.node_name,
        "mountpoint": export.mountpoint,
        "loops": loops,
        "queue": report.queue,
        "ops": report.ops,
        "per_queue": report.per_queue,
        "placement": report.placement,
        "backend": backend,
    })
}
