//! A qsd node graph resolved into the model's [`Node`], the one `corofuse mount IMAGE`
//! builds for the same image: format over protocol (a `qcow2` node over a `file` node is
//! the file read as qcow2; `raw` over `file` the file forced raw; a protocol node alone
//! is raw), `null-co` as `null:SIZE`, `nbd` as an NBD URI with the node's NBD options.
//! Also what qsd checks when a node is added, in its words.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use backend::{Format, NbdOptions};
use corofuse_qsd::{Backing, Blockdev, Child, Driver, SocketAddress};

use crate::model::Node;

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

    /// The node `node` is in the model: its format over its protocol layer.
    pub fn resolve(&self, node: &Blockdev) -> Result<Node, String> {
        let (protocol, format) = self.layers(node)?;
        let spec = match &protocol.driver {
            Driver::File { filename, .. } => format!("file:{filename}"),
            Driver::Null { size, .. } => format!("null:{size}"),
            Driver::Nbd { server, export, .. } => {
                let export = export.as_deref().unwrap_or("");
                match server {
                    SocketAddress::Unix(path) => format!("nbd+unix:///{export}?socket={path}"),
                    SocketAddress::Inet(host, port) => format!("nbd://{host}:{port}/{export}"),
                }
            }
            _ => {
                return Err(format!(
                    "a '{}' node cannot be the file of another node here",
                    protocol.driver_name()
                ))
            }
        };
        Ok(Node {
            format,
            read_only: node.read_only || protocol.read_only,
            direct: node.cache_direct || protocol.cache_direct,
            lock: !matches!(protocol.driver, Driver::File { locking: false, .. }),
            nbd: self.nbd_options(protocol),
            ..Node::new(&spec)
        })
    }

    /// The protocol node under `node` (itself if it is one) and the format over it.
    fn layers<'n>(&'n self, node: &'n Blockdev) -> Result<(&'n Blockdev, Format), String> {
        match &node.driver {
            Driver::Raw { file } => Ok((self.child(file)?, Format::Raw)),
            Driver::Qcow2 { file, backing } => {
                if let Backing::None = backing {
                    return Err(
                        "corofuse cannot open a qcow2 node without its backing file \
                                (backing=null)"
                            .into(),
                    );
                }
                Ok((self.child(file)?, Format::Qcow2))
            }
            _ => Ok((node, Format::Raw)),
        }
    }

    /// An NBD protocol node's options (the defaults for any other).
    fn nbd_options(&self, node: &Blockdev) -> NbdOptions {
        let Driver::Nbd {
            tls_creds,
            tls_hostname,
            reconnect_delay,
            open_timer,
            ..
        } = &node.driver
        else {
            return NbdOptions::default();
        };
        NbdOptions {
            reconnect_delay: Duration::from_secs(*reconnect_delay),
            open_timer: Duration::from_secs(*open_timer),
            tls: tls_creds.as_ref().map(|id| backend::nbd::TlsOptions {
                creds: self.tls.get(id).cloned().unwrap_or_default().into(),
                hostname: tls_hostname.clone(),
            }),
            ..NbdOptions::default()
        }
    }
}

/// A node that would not open, in qsd's words where the image file is the cause.
pub fn open_error(node: &Blockdev, nodes: &Graph<'_>, e: &io::Error) -> String {
    match nodes.layers(node).map(|(protocol, _)| &protocol.driver) {
        Ok(Driver::File { filename, .. }) if e.get_ref().is_none() => could_not_open(filename, e),
        _ => e.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: crate::mount::Args,
    }

    /// The node `corofuse mount ARGS... /mnt` builds.
    fn mount_node(args: &[&str]) -> Node {
        let argv = ["mount"].iter().chain(args).chain(["/mnt"].iter());
        crate::mount::node_of(&Cli::try_parse_from(argv).expect("parses").mount)
    }

    /// The node the qsd command line `--blockdev B...` builds for its last node.
    fn qsd_node(blockdevs: &[&str]) -> Node {
        let mut nodes = BTreeMap::new();
        let mut last = None;
        for text in blockdevs {
            let (tree, kv) = corofuse_qsd::keyval::parse_option(text, Some("driver")).unwrap();
            let node = Blockdev::parse(tree, kv).unwrap();
            let name = node.node_name.clone().unwrap();
            last = Some(name.clone());
            nodes.insert(name, node);
        }
        let tls = BTreeMap::new();
        let graph = Graph {
            nodes: &nodes,
            tls: &tls,
        };
        graph.resolve(&nodes[&last.unwrap()]).expect("resolves")
    }

    #[test]
    fn mount_is_shorthand_for_the_node_the_qsd_command_line_builds() {
        assert_eq!(
            mount_node(&[
                "--format",
                "qcow2",
                "--direct",
                "--no-lock",
                "file:/i.qcow2"
            ]),
            qsd_node(&[
                "file,node-name=f,filename=/i.qcow2,locking=off",
                "qcow2,node-name=q,file=f,cache.direct=on",
            ]),
            "qcow2 over a file node, by name"
        );
        assert_eq!(
            mount_node(&["--format", "raw", "file:/i.raw"]),
            qsd_node(&["raw,node-name=r,file.driver=file,file.filename=/i.raw"]),
            "raw over an inline file node"
        );
        assert_eq!(
            mount_node(&["--format", "raw", "file:/i.raw"]),
            qsd_node(&["file,node-name=f,filename=/i.raw"]),
            "a file node alone is raw"
        );
        assert_eq!(
            mount_node(&["--format", "raw", "null:1048576"]),
            qsd_node(&["null-co,node-name=n,size=1048576"])
        );
        let nbd = mount_node(&[
            "--nbd-connections",
            "1",
            "--reconnect-delay",
            "3",
            "nbd+unix:///e?socket=/s",
        ]);
        assert_eq!(
            Node {
                format: Format::Raw,
                ..nbd
            },
            qsd_node(&[
                "nbd,node-name=d,server.type=unix,server.path=/s,export=e,reconnect-delay=3"
            ])
        );
        let probed = mount_node(&["/i.img"]);
        assert_eq!(
            (probed.format, probed.lock, probed.protocol.as_str()),
            (Format::Auto, true, "/i.img"),
            "without --format the format layer is probed"
        );
    }
}
