//! A block node of the model opened as a backend: format over protocol resolved into
//! the one `backend::open` call `corofuse mount` makes for the same image (a `qcow2` node
//! over a `file` node is the file opened as qcow2; `raw` over `file` is the file forced
//! raw), `null-co` as `null:SIZE`, `nbd` as an NBD URI with the node's NBD options.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use backend::{BlockBackend, Format, OpenOptions};
use corofuse_qsd::{Backing, Blockdev, Child, Driver, SocketAddress};

/// What a node's children name: the nodes so far, and the TLS credentials by id.
pub struct Graph<'a> {
    pub nodes: &'a BTreeMap<String, Blockdev>,
    pub tls: &'a BTreeMap<String, String>,
}

impl Graph<'_> {
    /// The node a child names, or the inline one.
    pub fn child<'n>(&'n self, child: &'n Child) -> Result<&'n Blockdev, String> {
        match child {
            Child::Inline(node) => Ok(node),
            Child::Name(name) => self
                .nodes
                .get(name)
                .ok_or_else(|| format!("Cannot find device='{name}' nor node-name='{name}'")),
        }
    }

    /// Checks what qsd checks when the node is added: its children exist, its file can
    /// be opened, a qcow2 node's file is qcow2, its TLS credentials exist.
    pub fn check(&self, node: &Blockdev) -> Result<(), String> {
        match &node.driver {
            Driver::File { filename, .. } => std::fs::File::open(filename)
                .map(drop)
                .map_err(|e| could_not_open(filename, &e)),
            Driver::Raw { file } => self.check(self.child(file)?),
            Driver::Qcow2 { file, backing } => {
                let file = self.child(file)?;
                self.check(file)?;
                if let Backing::Node(_) = backing {
                    return Err(
                        "corofuse takes a qcow2 node's backing file from its header only \
                         (leave out 'backing')"
                            .into(),
                    );
                }
                match &file.driver {
                    Driver::File { filename, .. } if !is_qcow2(filename) => {
                        Err("Image is not in qcow2 format".into())
                    }
                    _ => Ok(()),
                }
            }
            Driver::Null { .. } => Ok(()),
            Driver::Nbd {
                tls_creds, server, ..
            } => {
                if let Some(id) = tls_creds.as_ref().filter(|id| !self.tls.contains_key(*id)) {
                    return Err(format!("No TLS credentials with id '{id}'"));
                }
                // qsd connects here; corofuse connects when the node is exported, but a
                // socket that is not there fails now, in qsd's words.
                match server {
                    SocketAddress::Unix(path) => std::fs::metadata(path)
                        .map(drop)
                        .map_err(|e| format!("Failed to connect to '{path}': {}", reason(&e))),
                    SocketAddress::Inet(..) => Ok(()),
                }
            }
        }
    }

    /// Opens `node` as a backend, writable if `writable` (and the node is not read-only).
    pub fn open(&self, node: &Blockdev, writable: bool) -> Result<Arc<dyn BlockBackend>, String> {
        let writable = writable && !node.read_only;
        let (protocol, format) = match &node.driver {
            Driver::Raw { file } => (self.child(file)?, Format::Raw),
            Driver::Qcow2 { file, backing } => {
                if let Backing::None = backing {
                    return Err(
                        "corofuse cannot open a qcow2 node without its backing file \
                                (backing=null)"
                            .into(),
                    );
                }
                (self.child(file)?, Format::Qcow2)
            }
            _ => (node, Format::Raw),
        };
        let writable = writable && !protocol.read_only;
        let options = OpenOptions {
            writable,
            direct: node.cache_direct || protocol.cache_direct,
            lock: !matches!(protocol.driver, Driver::File { locking: false, .. }),
            format,
            snapshot: None,
        };
        let opened = match &protocol.driver {
            Driver::File { filename, .. } => backend::open(&format!("file:{filename}"), &options),
            Driver::Null { size, .. } => {
                Ok(Arc::new(backend::NullBackend::new(*size, writable)) as Arc<dyn BlockBackend>)
            }
            Driver::Nbd { .. } => self.open_nbd(protocol, &options),
            _ => {
                return Err(format!(
                    "a '{}' node cannot be the file of another node here",
                    protocol.driver_name()
                ))
            }
        };
        opened.map_err(|e| match &protocol.driver {
            Driver::File { filename, .. } if e.get_ref().is_none() => could_not_open(filename, &e),
            _ => e.to_string(),
        })
    }

    fn open_nbd(
        &self,
        node: &Blockdev,
        options: &OpenOptions,
    ) -> io::Result<Arc<dyn BlockBackend>> {
        let Driver::Nbd {
            server,
            export,
            tls_creds,
            tls_hostname,
            reconnect_delay,
            open_timer,
        } = &node.driver
        else {
            unreachable!("open_nbd is called for nbd nodes")
        };
        let export = export.as_deref().unwrap_or("");
        let uri = match server {
            SocketAddress::Unix(path) => format!("nbd+unix:///{export}?socket={path}"),
            SocketAddress::Inet(host, port) => format!("nbd://{host}:{port}/{export}"),
        };
        let nbd = backend::NbdOptions {
            reconnect_delay: Duration::from_secs(*reconnect_delay),
            open_timer: Duration::from_secs(*open_timer),
            tls: tls_creds.as_ref().map(|id| backend::nbd::TlsOptions {
                creds: self.tls.get(id).cloned().unwrap_or_default().into(),
                hostname: tls_hostname.clone(),
            }),
            ..backend::NbdOptions::default()
        };
        backend::nbd::open_image(&uri, options, &nbd)
    }
}

/// QEMU's sentence: "Could not open '/x': No such file or directory".
fn could_not_open(filename: &str, e: &io::Error) -> String {
    format!("Could not open '{filename}': {}", reason(e))
}

/// An I/O error as QEMU words it: strerror's text, without Rust's "(os error N)".
pub fn reason(e: &io::Error) -> String {
    let text = e.to_string();
    text.split(" (os error").next().unwrap_or(&text).to_string()
}

fn is_qcow2(filename: &str) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(filename)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"QFI\xfb")
}
