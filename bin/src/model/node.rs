//! [`Node`]: a block node as corofuse opens it, a format layer over a protocol layer,
//! and the one place that turns it into a backend ([`Node::open`]).
//!
//! Both front ends build it: the storage daemon resolves a qsd node graph into it
//! (`storage_daemon::open`: a `qcow2` node over a `file` node is the file read as qcow2,
//! a node's `cache.direct`, `locking` and `read-only` its options), and `corofuse mount
//! IMAGE` is the shorthand for one ([`crate::mount`]: the image spec is the protocol,
//! `--format` the format layer, probed without it).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use backend::record::WriteLog;
use backend::{BlockBackend, Format, NbdOptions, OpenOptions};

/// One block node: what to open and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The protocol layer, as the backend names it: a file (`PATH` or `file:PATH`),
    /// `null:SIZE`, or an NBD URI (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///...`).
    pub protocol: String,
    /// The format layer over it: `Qcow2` (its backing file the one the image's header
    /// names), `Raw`, or `Auto`: probed by the magic, with QEMU's safeguards.
    pub format: Format,
    /// Never opened for writing, whatever an export asks.
    pub read_only: bool,
    /// `O_DIRECT` on the image file (`cache.direct`, `--direct`).
    pub direct: bool,
    /// QEMU's image locks (`locking`, `--no-lock`).
    pub lock: bool,
    /// An internal snapshot of a qcow2 image, exported read-only (`--snapshot`).
    pub snapshot: Option<String>,
    /// How an NBD protocol layer connects.
    pub nbd: NbdOptions,
    /// `--record-writes`: the write log's path and its most bytes.
    pub record: Option<(PathBuf, u64)>,
    /// `--inject`: a fault-injection filter over the node.
    pub inject: Option<backend::inject::Spec>,
}

impl Node {
    /// A node over `protocol` with the backend's defaults: format probed, locked,
    /// through the page cache, writable where an export asks.
    pub fn new(protocol: &str) -> Node {
        Node {
            protocol: protocol.to_string(),
            format: Format::Auto,
            read_only: false,
            direct: false,
            lock: true,
            snapshot: None,
            nbd: NbdOptions::default(),
            record: None,
            inject: None,
        }
    }

    /// Opens the node as a backend, writable if `writable` and the node is not read-only.
    /// The error is the backend's (a lock conflict carries `backend::LockError`), for the
    /// front end to word.
    pub fn open(&self, writable: bool) -> io::Result<Arc<dyn BlockBackend>> {
        let options = OpenOptions {
            writable: writable && !self.read_only,
            direct: self.direct,
            lock: self.lock,
            format: self.format,
            snapshot: self.snapshot.clone(),
        };
        let log = match &self.record {
            Some((path, max)) => Some(Arc::new(WriteLog::create(path, *max)?)),
            None => None,
        };
        let disk = if backend::nbd::is_nbd(&self.protocol) {
            backend::nbd::open_image_recorded(&self.protocol, &options, &self.nbd, log.as_ref())?
        } else {
            match &log {
                Some(log) => backend::open_recorded(&self.protocol, &options, log)?,
                None => backend::open(&self.protocol, &options)?,
            }
        };
        Ok(match &self.inject {
            Some(spec) => Arc::new(backend::InjectBackend::new(disk, spec.clone())),
            None => disk,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_opens_its_protocol_with_its_format_and_filters() {
        let null = Node::new("null:1M");
        assert_eq!(null.open(false).unwrap().len(), 1 << 20);
        assert!(null.open(false).unwrap().read_only());
        assert!(!null.open(true).unwrap().read_only());
        let read_only = Node {
            read_only: true,
            ..Node::new("null:1M")
        };
        assert!(read_only.open(true).unwrap().read_only(), "never writable");
        let injected = Node {
            inject: Some(backend::inject::parse("read:EIO").unwrap()),
            ..Node::new("null:4K")
        };
        assert!(injected.open(false).unwrap().inject_stats().is_some());
        let e = Node::new("null:1X").open(false).err().unwrap();
        assert!(
            e.to_string().starts_with("invalid image spec \"null:1X\""),
            "{e}"
        );
    }
}
