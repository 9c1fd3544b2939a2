//! `--blockdev` and QMP `blockdev-add`: a block node (qapi/block-core.json
//! `BlockdevOptions`), for the drivers corofuse has: `file`, `raw` and `qcow2` over a
//! protocol node, `null-co` and `nbd`. A child (`file`, `backing`) is either the name of
//! another node or a whole node inline, as in QEMU.

use serde::Serialize;
use serde_json::Value;

use crate::fields::Fields;

/// The drivers QEMU knows (for its error when a name is not one): those of QEMU 10.0
/// that corofuse does not serve are still recognised, so that they get the clear
/// "not supported" rather than QEMU's "does not accept value".
const QEMU_DRIVERS: &[&str] = &[
    "blkdebug",
    "blklogwrites",
    "blkreplay",
    "blkverify",
    "bochs",
    "cloop",
    "compress",
    "copy-before-write",
    "copy-on-read",
    "dmg",
    "file",
    "snapshot-access",
    "ftp",
    "ftps",
    "gluster",
    "host_cdrom",
    "host_device",
    "http",
    "https",
    "io_uring",
    "iscsi",
    "luks",
    "nbd",
    "nfs",
    "null-aio",
    "null-co",
    "nvme",
    "nvme-io_uring",
    "parallels",
    "preallocate",
    "qcow",
    "qcow2",
    "qed",
    "quorum",
    "raw",
    "rbd",
    "replication",
    "ssh",
    "throttle",
    "vdi",
    "vhdx",
    "virtio-blk-vfio-pci",
    "virtio-blk-vhost-user",
    "virtio-blk-vhost-vdpa",
    "vmdk",
    "vpc",
    "vvfat",
];

/// The drivers corofuse serves.
pub const SUPPORTED_DRIVERS: &[&str] = &["file", "raw", "qcow2", "null-co", "nbd"];

/// One block node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Blockdev {
    /// `node-name`: must be given for a root node; an inline child gets none.
    pub node_name: Option<String>,
    /// `read-only` (default off).
    pub read_only: bool,
    /// `cache.direct`: O_DIRECT.
    pub cache_direct: bool,
    /// `discard=unmap` (default `ignore`): whether discards reach the storage.
    pub discard_unmap: bool,
    /// What the driver is and its own options.
    pub driver: Driver,
}

/// A driver and its options.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Driver {
    /// `file`: a host file.
    File {
        /// `filename`.
        filename: String,
        /// `aio` (`threads`, `native`, `io_uring`): accepted; corofuse always uses io_uring.
        aio: Option<String>,
        /// `locking` (`on`, `off`, `auto`; default auto = on).
        locking: bool,
    },
    /// `raw` over `file`.
    Raw {
        /// The protocol node.
        file: Box<Child>,
    },
    /// `qcow2` over `file`.
    Qcow2 {
        /// The protocol node.
        file: Box<Child>,
        /// `backing`: absent = the one the image names; `null` = none.
        backing: Backing,
    },
    /// `null-co`.
    Null {
        /// `size` in bytes (default 1 GiB).
        size: u64,
        /// `read-zeroes` (reads return zeroes; corofuse's null always does).
        read_zeroes: bool,
    },
    /// `nbd`.
    Nbd {
        /// `server`.
        server: SocketAddress,
        /// `export` name.
        export: Option<String>,
        /// `tls-creds`: the id of a `tls-creds-x509` object.
        tls_creds: Option<String>,
        /// `tls-hostname`.
        tls_hostname: Option<String>,
        /// `reconnect-delay` in seconds.
        reconnect_delay: u64,
        /// `open-timer` in seconds.
        open_timer: u64,
    },
}

/// A child: a node's name, or a node given inline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Child {
    /// Another node, by `node-name`.
    Name(String),
    /// A node of its own.
    Inline(Blockdev),
}

/// A qcow2 node's `backing`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Backing {
    /// Not given: the backing file the image's header names.
    Default,
    /// `backing=null` (JSON null, or keyval `backing=`): none.
    None,
    /// A node (not supported by corofuse yet: refused when opened).
    Node(Box<Child>),
}

/// An NBD server's address (`SocketAddress`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum SocketAddress {
    /// `type=unix,path=...`.
    Unix(String),
    /// `type=inet,host=...,port=...`.
    Inet(String, String),
}

impl Blockdev {
    /// Reads `--blockdev`'s or `blockdev-add`'s arguments.
    pub fn parse(value: Value, keyval: bool) -> Result<Blockdev, String> {
        let mut f = Fields::new(value, keyval)?;
        let node = Self::read(&mut f)?;
        f.finish()?;
        Ok(node)
    }

    fn read(f: &mut Fields) -> Result<Blockdev, String> {
        let driver = f.req_str("driver")?;
        if !QEMU_DRIVERS.contains(&driver.as_str()) {
            return Err(f.rejects("driver", &driver));
        }
        let node_name = f.str("node-name")?;
        if let Some(name) = &node_name {
            check_node_name(name)?;
        }
        let discard = f.choice("discard", &["ignore", "off", "unmap", "on"])?;
        let cache_direct = match f.object("cache")? {
            Some(mut cache) => {
                let direct = cache.bool("direct")?.unwrap_or(false);
                cache.bool("no-flush")?;
                cache.finish()?;
                direct
            }
            None => false,
        };
        let read_only = f.bool("read-only")?.unwrap_or(false);
        f.bool("auto-read-only")?;
        f.bool("force-share")?;
        f.choice("detect-zeroes", &["off", "on", "unmap"])?;
        let driver = match driver.as_str() {
            "file" => file(f)?,
            "raw" => Driver::Raw {
                file: Box::new(child(f, "file")?.ok_or_else(|| f.missing("file"))?),
            },
            "qcow2" => qcow2(f)?,
            "null-co" => Driver::Null {
                size: f.int("size")?.unwrap_or(1 << 30),
                read_zeroes: f.bool("read-zeroes")?.unwrap_or(false),
            },
            "nbd" => nbd(f)?,
            other => {
                return Err(format!(
                    "Driver '{other}' is not supported by corofuse (supported: {})",
                    SUPPORTED_DRIVERS.join(", ")
                ))
            }
        };
        Ok(Blockdev {
            node_name,
            read_only,
            cache_direct,
            discard_unmap: matches!(discard.as_deref(), Some("unmap" | "on")),
            driver,
        })
    }

    /// The driver's name, as QEMU spells it.
    pub fn driver_name(&self) -> &'static str {
        match self.driver {
            Driver::File { .. } => "file",
            Driver::Raw { .. } => "raw",
            Driver::Qcow2 { .. } => "qcow2",
            Driver::Null { .. } => "null-co",
            Driver::Nbd { .. } => "nbd",
        }
    }
}

/// QEMU's rule: letters, digits, `-`, `.`, `_`, starting with a letter, at most 31.
fn check_node_name(name: &str) -> Result<(), String> {
    let ok = name.len() < 32
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    match ok {
        true => Ok(()),
        false => Err(format!("Invalid node-name: '{name}'")),
    }
}

fn file(f: &mut Fields) -> Result<Driver, String> {
    let filename = f.req_str("filename")?;
    let aio = f.choice("aio", &["threads", "native", "io_uring"])?;
    let locking = f.choice("locking", &["off", "on", "auto"])?;
    f.choice("pr-manager", &[])?;
    Ok(Driver::File {
        filename,
        aio,
        locking: locking.as_deref() != Some("off"),
    })
}

fn qcow2(f: &mut Fields) -> Result<Driver, String> {
    let file = child(f, "file")?.ok_or_else(|| f.missing("file"))?;
    let backing = match f.take("backing") {
        None => Backing::Default,
        Some(Value::Null) => Backing::None,
        Some(Value::String(s)) if s.is_empty() => Backing::None,
        Some(v) => Backing::Node(Box::new(child_of(v, f.keyval(), &f.name("backing"))?)),
    };
    Ok(Driver::Qcow2 {
        file: Box::new(file),
        backing,
    })
}

fn nbd(f: &mut Fields) -> Result<Driver, String> {
    let mut server = f.object("server")?.ok_or_else(|| f.missing("server"))?;
    let kind = server.req_str("type")?;
    let address = match kind.as_str() {
        "unix" => SocketAddress::Unix(server.req_str("path")?),
        "inet" => SocketAddress::Inet(server.req_str("host")?, server.req_str("port")?),
        other => return Err(server.rejects("type", other)),
    };
    server.bool("abstract")?;
    server.finish()?;
    Ok(Driver::Nbd {
        server: address,
        export: f.str("export")?,
        tls_creds: f.str("tls-creds")?,
        tls_hostname: f.str("tls-hostname")?,
        reconnect_delay: f.int("reconnect-delay")?.unwrap_or(0),
        open_timer: f.int("open-timer")?.unwrap_or(0),
    })
}

/// Member `key` as a child: a node name (string) or an inline node (object).
fn child(f: &mut Fields, key: &str) -> Result<Option<Child>, String> {
    let name = f.name(key);
    f.take(key)
        .map(|v| child_of(v, f.keyval(), &name))
        .transpose()
}

fn child_of(value: Value, keyval: bool, name: &str) -> Result<Child, String> {
    match value {
        Value::String(s) => Ok(Child::Name(s)),
        Value::Object(_) => {
            let mut inner = Fields::new(value, keyval)?;
            let node = Blockdev::read(&mut inner)?;
            inner.finish()?;
            Ok(Child::Inline(node))
        }
        _ => Err(format!(
            "Invalid parameter type for '{name}', expected: BlockdevRef"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyval;

    fn parse(text: &str) -> Result<Blockdev, String> {
        let (v, kv) = keyval::parse_option(text, Some("driver"))?;
        Blockdev::parse(v, kv)
    }

    #[test]
    fn file_qcow2_null_and_nbd() {
        let b = parse("file,node-name=f,filename=/i,,mg,cache.direct=on,aio=io_uring").unwrap();
        assert_eq!(b.node_name.as_deref(), Some("f"));
        assert!(b.cache_direct);
        assert!(
            matches!(b.driver, Driver::File { ref filename, locking: true, .. } if filename == "/i,mg")
        );
        let q = parse("qcow2,node-name=q,file.driver=file,file.filename=/x,backing=").unwrap();
        assert!(matches!(
            q.driver,
            Driver::Qcow2 {
                backing: Backing::None,
                ..
            }
        ));
        let n = parse(r#"{"driver":"null-co","node-name":"n","size":4096,"read-zeroes":true}"#)
            .unwrap();
        assert_eq!(
            n.driver,
            Driver::Null {
                size: 4096,
                read_zeroes: true
            }
        );
        let d = parse("nbd,node-name=d,server.type=unix,server.path=/s,export=e,reconnect-delay=3")
            .unwrap();
        assert!(matches!(
            d.driver,
            Driver::Nbd {
                reconnect_delay: 3,
                ..
            }
        ));
    }

    #[test]
    fn errors_are_qemus() {
        let err = |t| parse(t).unwrap_err();
        assert_eq!(err("driver=file"), "Parameter 'filename' is missing");
        assert_eq!(err("node-name=a"), "Parameter 'driver' is missing");
        assert_eq!(
            err("driver=foo"),
            "Parameter 'driver' does not accept value 'foo'"
        );
        assert_eq!(
            err("null-co,node-name=n,size=1M"),
            "Parameter 'size' expects integer"
        );
        assert_eq!(
            err("null-co,node-name=n,bogus=1"),
            "Parameter 'bogus' is unexpected"
        );
        assert_eq!(err("null-co,node-name=1n"), "Invalid node-name: '1n'");
        assert_eq!(err("raw,node-name=q"), "Parameter 'file' is missing");
        assert_eq!(err("nbd,node-name=n"), "Parameter 'server' is missing");
        assert_eq!(
            err("nbd,node-name=n,server.type=unix"),
            "Parameter 'server.path' is missing"
        );
        assert_eq!(
            err("file,node-name=f,filename=/x,locking=maybe"),
            "Parameter 'locking' does not accept value 'maybe'"
        );
        assert!(err("vmdk,node-name=v").contains("not supported by corofuse"));
    }
}
