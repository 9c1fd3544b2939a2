//! [`Model`]: the block nodes and the exports of them that one corofuse process serves,
//! as one model for every front end. The storage daemon's command line and QMP add and
//! remove nodes and exports in it while others serve; `corofuse mount IMAGE MNT` is the
//! shorthand for one [`Node`] and one export of it, served on loops of its own.
//!
//! Why one model: opening a node (format over protocol, backing, file options), building
//! the image export over it, choosing its loops and serving it, counting it for `--stats`
//! and releasing it at close are the same work whoever asks; done once here, a fix or a
//! speed-up reaches `mount` and the daemon alike. What stays with each front end is its
//! language: arguments, error wording, events.
//!
//! A node is opened at its first export, once, and shared by its later exports (writable
//! if the first one is); the model lets it go when its last export is gone. Each export
//! is served by [`server::Exports`]: on loops of its own ([`ExportSpec::loops`] `None`, as
//! `mount`) or on chosen loops of the set the exports share (qsd's iothreads). Removing
//! an export returns once its mount is gone and its node flushed; the node's last export
//! also closes it (its locks released, its closing writes done), while one of two
//! exports of a node only flushes it, so that the other serves on with the image locked
//! and whole ([`Export::sharing`]).

mod node;

pub use node::Node;

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use backend::BlockBackend;
use image_export::{Export, ExportOptions};
use server::{Background, Exports, LoopSet, Report, ServeOptions, Served, Target};

/// A node opened for its exports.
struct Opened {
    backend: Arc<dyn BlockBackend>,
    writable: bool,
    /// Its exports; each one's close only flushes while another counts
    /// ([`Export::sharing`]). Counted out once an export is gone.
    exports: Arc<AtomicUsize>,
}

/// What the model keeps of a live export.
struct Live {
    node: String,
    /// The shared loops it runs on (empty: loops of its own).
    loops: Vec<usize>,
}

/// One export of a node: where, as what, and how it is served.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportSpec {
    /// Its id among the exports.
    pub id: String,
    /// The node exported.
    pub node: String,
    /// An existing regular file to mount on.
    pub mountpoint: PathBuf,
    /// The mount's source as /proc/mounts shows it.
    pub name: String,
    /// Writes allowed (the node is then opened writable).
    pub writable: bool,
    /// Writes past the end grow the node.
    pub growable: bool,
    /// FUSE passthrough of a raw image file.
    pub passthrough: bool,
    /// How it is served (`allow_other` the mount's too).
    pub serve: ServeOptions,
    /// The loops of the shared set it runs on; `None`: loops of its own, as `serve` says.
    pub loops: Option<Vec<usize>>,
}

/// Why an export was not added.
#[derive(Debug)]
pub enum ExportError {
    /// The node would not open (the backend's error, for the front end to word).
    Open(io::Error),
    /// Anything else, in a sentence.
    Refused(String),
}

impl From<String> for ExportError {
    fn from(message: String) -> ExportError {
        ExportError::Refused(message)
    }
}

impl From<server::ExportError> for ExportError {
    fn from(e: server::ExportError) -> ExportError {
        ExportError::Refused(e.to_string())
    }
}

/// The file system's own `--stats` sections, by name.
pub type Sections = BTreeMap<String, serde_json::Value>;

/// The nodes and their exports.
pub struct Model {
    nodes: BTreeMap<String, Node>,
    opened: BTreeMap<String, Opened>,
    exports: Exports<Export>,
    live: BTreeMap<String, Live>,
}

impl Model {
    /// No node and no export yet; exports given loops run on loops of `set`.
    pub fn new(set: LoopSet) -> Model {
        Model {
            nodes: BTreeMap::new(),
            opened: BTreeMap::new(),
            exports: Exports::with_loops(Arc::new(set)),
            live: BTreeMap::new(),
        }
    }

    /// The loops the exports share.
    pub fn loops(&self) -> &Arc<LoopSet> {
        self.exports.loops()
    }

    /// Adds node `name`.
    pub fn add_node(&mut self, name: &str, node: Node) -> Result<(), String> {
        if self.nodes.contains_key(name) {
            return Err(format!("Duplicate nodes with node-name='{name}'"));
        }
        self.nodes.insert(name.to_string(), node);
        Ok(())
    }

    /// Removes node `name`, unless an export uses it.
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

    /// What is refused before anything is opened: a taken id, a missing node, writes to
    /// a read-only node.
    pub fn check_export(&self, spec: &ExportSpec) -> Result<(), String> {
        if self.live.contains_key(&spec.id) {
            return Err(format!("Block export id '{}' is already in use", spec.id));
        }
        let node = self
            .nodes
            .get(&spec.node)
            .ok_or_else(|| format!("Cannot find device='' nor node-name='{}'", spec.node))?;
        if spec.writable && node.read_only {
            return Err(format!(
                "Block node is read-only ('{}' has read-only=on)",
                spec.node
            ));
        }
        Ok(())
    }

    /// Opens the node (at its first export), mounts the export and serves it; the mount
    /// is live on return. Returns the file system served, for the front end's counters.
    pub fn add_export(&mut self, spec: &ExportSpec) -> Result<Arc<Export>, ExportError> {
        self.check_export(spec)?;
        let backend = self.open_node(&spec.node, spec.writable)?;
        let added = self.serve_export(spec, backend);
        if added.is_err() {
            self.release_node(&spec.node);
        }
        let fs = added?;
        let live = Live {
            node: spec.node.clone(),
            loops: spec.loops.clone().unwrap_or_default(),
        };
        self.live.insert(spec.id.clone(), live);
        Ok(fs)
    }

    fn serve_export(
        &mut self,
        spec: &ExportSpec,
        backend: Arc<dyn BlockBackend>,
    ) -> Result<Arc<Export>, ExportError> {
        if spec.passthrough && backend.passthrough_file().is_none() {
            return Err(ExportError::Refused(format!(
                "--passthrough needs a raw image file whose bytes are the exported ones, not {}",
                backend.describe()
            )));
        }
        let sharers = Arc::clone(&self.opened[&spec.node].exports);
        let fs = Arc::new(Export::sharing(
            backend,
            ExportOptions {
                writable: spec.writable,
                growable: spec.growable,
                allow_other: spec.serve.allow_other,
                passthrough: spec.passthrough,
            },
            sharers,
        ));
        let target = Target {
            mountpoint: spec.mountpoint.clone(),
            name: spec.name.clone(),
            directory: false,
            read_only: false,
        };
        let served = Arc::clone(&fs);
        match &spec.loops {
            None => self.exports.add(&spec.id, served, &target, &spec.serve)?,
            Some(on) => self
                .exports
                .add_on(&spec.id, served, &target, &spec.serve, on)?,
        }
        Ok(fs)
    }

    /// The node's backend, opened at its first export (writable if that one is).
    fn open_node(
        &mut self,
        name: &str,
        writable: bool,
    ) -> Result<Arc<dyn BlockBackend>, ExportError> {
        if let Some(opened) = self.opened.get_mut(name) {
            if writable && !opened.writable {
                return Err(ExportError::Refused(format!(
                    "Node '{name}' is exported read-only already; corofuse opens a node once: \
                     remove that export first"
                )));
            }
            opened.exports.fetch_add(1, Ordering::AcqRel);
            return Ok(Arc::clone(&opened.backend));
        }
        let backend = self.nodes[name].open(writable).map_err(ExportError::Open)?;
        let opened = Opened {
            backend: Arc::clone(&backend),
            writable,
            exports: Arc::new(AtomicUsize::new(1)),
        };
        self.opened.insert(name.to_string(), opened);
        Ok(backend)
    }

    fn release_node(&mut self, name: &str) {
        if let Some(opened) = self.opened.get_mut(name) {
            if opened.exports.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.opened.remove(name);
            }
        }
    }

    /// Stops export `id` and returns how serving ended, once its mount is gone (and its
    /// node closed, if it was the last export of it); `None` if there is no such export.
    pub fn remove_export(&mut self, id: &str) -> Option<Served> {
        let live = self.live.remove(id)?;
        let served = self.exports.remove(id);
        self.release_node(&live.node);
        served
    }

    /// Takes out the exports whose serving ended by itself (unmounted from outside, or
    /// failed), with how each ended.
    pub fn reap(&mut self) -> Vec<(String, Served)> {
        let ended = self.exports.reap();
        for (id, _) in &ended {
            if let Some(live) = self.live.remove(id) {
                self.release_node(&live.node);
            }
        }
        ended
    }

    /// Export `id`'s serving (its handle, dispatch and file system).
    pub fn export(&self, id: &str) -> Option<&Background<Export>> {
        self.exports.background(id)
    }

    /// The shared loops export `id` runs on (empty: loops of its own, or no such export).
    pub fn loops_of(&self, id: &str) -> &[usize] {
        self.live.get(id).map_or(&[], |l| l.loops.as_slice())
    }

    /// Export `id`'s statistics so far (`None` if there is none or it does not answer).
    pub fn snapshot(&self, id: &str) -> Option<Report> {
        self.exports.snapshot(id)
    }

    /// A node's size: its open backend's, else opened for a moment, read-only, unlocked.
    pub fn size_of(&self, name: &str) -> io::Result<u64> {
        if let Some(opened) = self.opened.get(name) {
            return Ok(opened.backend.len());
        }
        let node = Node {
            lock: false,
            ..self.nodes.get(name).ok_or_else(|| missing(name))?.clone()
        };
        Ok(node.open(false)?.len())
    }

    /// Resizes node `name` (opened writable for it if no export has it); an export's
    /// file follows.
    pub fn resize(&mut self, name: &str, size: u64) -> Result<(), ExportError> {
        let backend = match self.opened.get(name) {
            Some(o) if o.writable => Arc::clone(&o.backend),
            Some(_) => return Err(ExportError::Refused("Block node is read-only".into())),
            None => (self.nodes.get(name).ok_or_else(|| missing(name)))
                .and_then(|node| node.open(true))
                .map_err(ExportError::Open)?,
        };
        backend
            .resize(&runtime::Ctx::Blocking, size)
            .map_err(|e| ExportError::Refused(format!("Could not resize: {e}")))
    }

    /// Node `name`'s backend, for a change made through it while its exports serve (an
    /// internal snapshot): the open one, else the node opened for the change, writable
    /// unless it is read-only (the change then fails as on a read-only open).
    pub fn backend_of(&self, name: &str) -> io::Result<Arc<dyn BlockBackend>> {
        if let Some(opened) = self.opened.get(name) {
            return Ok(Arc::clone(&opened.backend));
        }
        let node = self.nodes.get(name).ok_or_else(|| missing(name))?;
        node.open(!node.read_only)
    }
}

/// No node by that name.
fn missing(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("Cannot find device='' nor node-name='{name}'"),
    )
}

/// An image export's own `--stats` sections: its backend's counters, what fault
/// injection fired, what passthrough did (those that apply).
pub fn sections(export: &Export) -> Sections {
    let backend = export.backend();
    [
        section("backend", Some(backend.stats())),
        section("inject", backend.inject_stats()),
        section("passthrough", export.passthrough_stats()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// One section for [`Sections`]; `None` leaves it out.
pub fn section(
    name: &str,
    value: Option<impl serde::Serialize>,
) -> Option<(String, serde_json::Value)> {
    let value = serde_json::to_value(value?).expect("a section serialises");
    Some((name.to_string(), value))
}
