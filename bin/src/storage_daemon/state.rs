//! [`Daemon`]: the nodes, objects and exports of one storage daemon, changed by the
//! command line at start and by QMP while it serves. Every export is built as `corofuse
//! mount` builds one (an `image_export::Export` over the node's backend, served by the
//! `server` crate) and lives in a [`server::Exports`], so adding or removing one leaves
//! the others serving.

use std::collections::BTreeMap;
use std::sync::Arc;

use backend::BlockBackend;
use corofuse_qsd::{AllowOther, BlockExport, Blockdev, Object};
use image_export::{Export, ExportOptions};
use serde_json::{json, Value};
use server::{Exports, ServeOptions, Target};

use super::open::reason;

/// A node opened for its exports.
struct Opened {
    backend: Arc<dyn BlockBackend>,
    writable: bool,
    exports: usize,
}

/// Everything the daemon has.
#[derive(Default)]
pub struct Daemon {
    nodes: BTreeMap<String, Blockdev>,
    opened: BTreeMap<String, Opened>,
    exports: Exports<Export>,
    info: BTreeMap<String, BlockExport>,
    iothreads: Vec<(String, Option<u64>)>,
    tls: BTreeMap<String, String>,
    /// Events to send once the current command's answer is out: (name, data).
    pub events: Vec<(&'static str, Value)>,
}

impl Daemon {
    /// `--object`.
    pub fn add_object(&mut self, object: Object) -> Result<(), String> {
        let id = object.id().to_string();
        let taken = self.iothreads.iter().any(|(i, _)| *i == id) || self.tls.contains_key(&id);
        if taken {
            return Err(format!(
                "attempt to add duplicate property '{id}' to object (type 'container')"
            ));
        }
        match object {
            Object::Iothread { id, poll_max_ns } => self.iothreads.push((id, poll_max_ns)),
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
        self.nodes.insert(name, node);
        Ok(())
    }

    /// `blockdev-del`.
    pub fn del_node(&mut self, name: &str) -> Result<(), String> {
        if !self.nodes.contains_key(name) {
            return Err(format!("Failed to find node with node-name='{name}'"));
        }
        if self.opened.contains_key(name) {
            return Err(format!("Node {name} is in use"));
        }
        self.nodes.remove(name);
        Ok(())
    }

    /// `--export`, `block-export-add`: the mount is live on return.
    pub fn add_export(&mut self, export: BlockExport) -> Result<(), String> {
        if self.info.contains_key(&export.id) {
            return Err(format!("Block export id '{}' is already in use", export.id));
        }
        let node = self
            .nodes
            .get(&export.node_name)
            .ok_or_else(|| format!("Cannot find device='' nor node-name='{}'", export.node_name))?;
        if let Some(missing) = export
            .iothreads
            .iter()
            .find(|id| !self.iothreads.iter().any(|(i, _)| i == *id))
        {
            return Err(format!("iothread \"{missing}\" not found"));
        }
        if let Err(e) = std::fs::metadata(&export.mountpoint) {
            let reason = reason(&e);
            return Err(format!("Failed to stat '{}': {reason}", export.mountpoint));
        }
        if export.writable && node.read_only {
            return Err(format!(
                "Block node is read-only ('{}' has read-only=on)",
                export.node_name
            ));
        }
        let backend = self.backend_for(&export)?;
        let fs = Arc::new(Export::new(
            backend,
            ExportOptions {
                writable: export.writable,
                growable: export.growable,
                allow_other: self.allow_other(&export),
                passthrough: false,
            },
        ));
        let target = Target {
            mountpoint: export.mountpoint.clone().into(),
            name: export.node_name.clone(),
            directory: false,
            read_only: false,
        };
        let added = self
            .exports
            .add(&export.id, fs, &target, &self.serve_options(&export));
        if let Err(e) = added {
            self.release_node(&export.node_name);
            return Err(e);
        }
        self.info.insert(export.id.clone(), export);
        Ok(())
    }

    /// The node's backend, opened at its first export (writable if that one is).
    fn backend_for(&mut self, export: &BlockExport) -> Result<Arc<dyn BlockBackend>, String> {
        let name = &export.node_name;
        if let Some(opened) = self.opened.get_mut(name) {
            if export.writable && !opened.writable {
                return Err(format!(
                    "Node '{name}' is exported read-only already; corofuse opens a node once: \
                     remove that export first"
                ));
            }
            opened.exports += 1;
            return Ok(Arc::clone(&opened.backend));
        }
        let node = &self.nodes[name];
        let backend = self.graph().open(node, export.writable)?;
        self.opened.insert(
            name.clone(),
            Opened {
                backend: Arc::clone(&backend),
                writable: export.writable,
                exports: 1,
            },
        );
        Ok(backend)
    }

    fn release_node(&mut self, name: &str) {
        if let Some(opened) = self.opened.get_mut(name) {
            opened.exports -= 1;
            if opened.exports == 0 {
                self.opened.remove(name);
            }
        }
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

    /// The export's serving: as `corofuse mount`'s defaults, with one event loop per
    /// iothread named (their `poll-max-ns` as the loops' polling), or the default loops.
    fn serve_options(&self, export: &BlockExport) -> ServeOptions {
        let poll_ns = export
            .iothreads
            .iter()
            .filter_map(|id| self.iothreads.iter().find(|(i, _)| i == id))
            .filter_map(|(_, ns)| *ns)
            .max()
            .unwrap_or(0);
        ServeOptions {
            allow_other: self.allow_other(export),
            queues: (!export.iothreads.is_empty()).then_some(export.iothreads.len()),
            poll_us: poll_ns / 1000,
            ..ServeOptions::default()
        }
    }

    /// `block-export-del`: the mount is gone (and the image free) on return; the event
    /// `BLOCK_EXPORT_DELETED` is queued.
    pub fn del_export(&mut self, id: &str) -> Result<(), String> {
        let Some(export) = self.info.remove(id) else {
            return Err(format!("Export '{id}' is not found"));
        };
        if let Some(served) = self.exports.remove(id) {
            if let Err(e) = served.result {
                log::warn!("export '{id}': {e}");
            }
        }
        self.release_node(&export.node_name);
        self.events
            .push(("BLOCK_EXPORT_DELETED", json!({ "id": id })));
        Ok(())
    }

    /// Exports unmounted from outside: removed, each with its event.
    pub fn reap(&mut self) {
        for (id, served) in self.exports.reap() {
            if let Err(e) = served.result {
                log::warn!("export '{id}': {e}");
            }
            if let Some(export) = self.info.remove(&id) {
                self.release_node(&export.node_name);
            }
            self.events
                .push(("BLOCK_EXPORT_DELETED", json!({ "id": id })));
        }
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
                let size = self.size_of(name).unwrap_or(0);
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

    /// A node's size: its open backend's, else opened for a moment, read-only, unlocked.
    fn size_of(&self, name: &str) -> Result<u64, String> {
        if let Some(opened) = self.opened.get(name) {
            return Ok(opened.backend.len());
        }
        let mut node = self.nodes[name].clone();
        if let corofuse_qsd::Driver::File { locking, .. } = &mut node.driver {
            *locking = false;
        }
        Ok(self.graph().open(&node, false)?.len())
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
        let backend = match self.opened.get(name) {
            Some(o) if o.writable => Arc::clone(&o.backend),
            Some(_) => return Err("Block node is read-only".into()),
            None => self.graph().open(node, true)?,
        };
        backend
            .resize(&runtime::Ctx::Blocking, size)
            .map_err(|e| format!("Could not resize: {e}"))
    }

    /// `query-iothreads`.
    pub fn query_iothreads(&self) -> Value {
        let list: Vec<Value> = self
            .iothreads
            .iter()
            .map(|(id, ns)| json!({"id": id, "thread-id": std::process::id(), "poll-max-ns": ns.unwrap_or(0), "poll-grow": 0, "poll-shrink": 0, "aio-max-batch": 0}))
            .collect();
        Value::Array(list)
    }
}
