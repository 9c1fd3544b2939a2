//! `--object` (`iothread`, `tls-creds-x509`), `--chardev socket` and `--monitor`: what a
//! qemu-storage-daemon command line sets up besides nodes and exports.

use serde::Serialize;
use serde_json::Value;

use crate::fields::Fields;

/// An `--object` corofuse knows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Object {
    /// `iothread,id=...`: one event loop.
    Iothread {
        /// `id`.
        id: String,
        /// `poll-max-ns`: how long the loop may spin for the next request.
        poll_max_ns: Option<u64>,
    },
    /// `tls-creds-x509,id=...,dir=...`: a directory of PEM files for NBD over TLS.
    TlsCredsX509 {
        /// `id`.
        id: String,
        /// `dir`.
        dir: String,
        /// `endpoint` (`client` for an NBD node).
        endpoint: String,
    },
}

/// QOM types qemu-storage-daemon can create (for its error on a name it does not know).
const QEMU_OBJECTS: &[&str] = &[
    "authz-list",
    "authz-listfile",
    "authz-pam",
    "authz-simple",
    "cryptodev-backend-builtin",
    "filter-buffer",
    "input-barrier",
    "iothread",
    "main-loop",
    "memory-backend-file",
    "memory-backend-memfd",
    "memory-backend-ram",
    "pr-manager-helper",
    "qtest",
    "rng-builtin",
    "rng-egd",
    "rng-random",
    "secret",
    "secret_keyring",
    "throttle-group",
    "tls-cipher-suites",
    "tls-creds-anon",
    "tls-creds-psk",
    "tls-creds-x509",
    "x-remote-object",
    "x-vfio-user-server",
];

impl Object {
    /// Reads `--object`'s arguments.
    pub fn parse(value: Value, keyval: bool) -> Result<Object, String> {
        let mut f = Fields::new(value, keyval)?;
        let kind = f.req_str("qom-type")?;
        if !QEMU_OBJECTS.contains(&kind.as_str()) {
            return Err(f.rejects("qom-type", &kind));
        }
        let id = f.req_str("id")?;
        if !is_identifier(&id) {
            return Err(
                "Parameter 'id' expects an identifier\nIdentifiers consist of letters, \
                        digits, '-', '.', '_', starting with a letter."
                    .into(),
            );
        }
        let object = match kind.as_str() {
            "iothread" => {
                let poll_max_ns = f.int("poll-max-ns")?;
                for key in [
                    "poll-grow",
                    "poll-shrink",
                    "aio-max-batch",
                    "thread-pool-min",
                    "thread-pool-max",
                ] {
                    f.int(key)?;
                }
                Object::Iothread { id, poll_max_ns }
            }
            "tls-creds-x509" => {
                let endpoint = f
                    .choice("endpoint", &["client", "server"])?
                    .unwrap_or_else(|| "client".into());
                let dir = f.str("dir")?;
                f.bool("verify-peer")?;
                f.str("priority")?;
                f.bool("sanity-check")?;
                let dir = dir.ok_or("Missing 'dir' property value")?;
                Object::TlsCredsX509 { id, dir, endpoint }
            }
            other => {
                return Err(format!(
                    "Object type '{other}' is not supported by corofuse (supported: \
                     iothread, tls-creds-x509)"
                ))
            }
        };
        f.finish()?;
        Ok(object)
    }

    /// The object's `id`.
    pub fn id(&self) -> &str {
        match self {
            Object::Iothread { id, .. } | Object::TlsCredsX509 { id, .. } => id,
        }
    }
}

/// QEMU's identifiers: letters, digits, `-`, `.`, `_`, starting with a letter.
fn is_identifier(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_alphabetic())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

/// A `--chardev socket` that a monitor listens on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chardev {
    /// `id`.
    pub id: String,
    /// `path`: a unix socket.
    pub path: String,
    /// `server=on`: listen (else connect, which corofuse does not do).
    pub server: bool,
}

impl Chardev {
    /// Reads `--chardev`'s arguments (QemuOpts: the leading bare value is the backend).
    pub fn parse(value: Value) -> Result<Chardev, String> {
        let mut f = Fields::new(value, true)?;
        let backend = f.str("backend")?.unwrap_or_default();
        let id = f.str("id")?.ok_or("chardev: no id specified")?;
        if backend != "socket" {
            return Err(match backend.as_str() {
                "file" | "pipe" | "stdio" | "null" | "pty" | "udp" | "serial" | "parallel"
                | "memory" | "ringbuf" | "mux" => format!(
                    "Chardev backend '{backend}' is not supported by corofuse (supported: socket)"
                ),
                _ => format!("'{backend}' is not a valid char driver name"),
            });
        }
        let path = f.str("path")?;
        let server = f.bool("server")?.unwrap_or(false);
        f.bool("wait")?;
        f.bool("nowait")?;
        f.str("telnet")?;
        let path = path.ok_or("chardev socket: corofuse needs path= (a unix socket)")?;
        if !server {
            return Err(format!(
                "Failed to connect to '{path}': corofuse listens only (give server=on)"
            ));
        }
        f.finish()?;
        Ok(Chardev { id, path, server })
    }
}

/// `--monitor [chardev=]ID[,mode=control][,pretty=on|off]`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Monitor {
    /// The chardev's id.
    pub chardev: String,
    /// `pretty`: indented JSON.
    pub pretty: bool,
}

impl Monitor {
    /// Reads `--monitor`'s arguments.
    pub fn parse(value: Value) -> Result<Monitor, String> {
        let mut f = Fields::new(value, true)?;
        let chardev = f.req_str("chardev")?;
        if let Some("readline") = f.choice("mode", &["control", "readline"])?.as_deref() {
            return Err("Only QMP is supported".into());
        }
        let pretty = f.bool("pretty")?.unwrap_or(false);
        f.str("id")?;
        f.finish()?;
        Ok(Monitor { chardev, pretty })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyval::parse;

    #[test]
    fn objects_chardevs_and_monitors() {
        let o = Object::parse(
            parse("iothread,id=i,poll-max-ns=0", Some("qom-type")).unwrap(),
            true,
        );
        assert_eq!(
            o,
            Ok(Object::Iothread {
                id: "i".into(),
                poll_max_ns: Some(0)
            })
        );
        let err = Object::parse(parse("foo,id=x", Some("qom-type")).unwrap(), true).unwrap_err();
        assert_eq!(err, "Parameter 'qom-type' does not accept value 'foo'");
        let err = Object::parse(parse("iothread", Some("qom-type")).unwrap(), true).unwrap_err();
        assert_eq!(err, "Parameter 'id' is missing");
        let c = Chardev::parse(
            parse("socket,id=c,path=/s,server=on,wait=off", Some("backend")).unwrap(),
        );
        assert_eq!(c.unwrap().path, "/s");
        let err = Chardev::parse(parse("socket,path=/x", Some("backend")).unwrap()).unwrap_err();
        assert_eq!(err, "chardev: no id specified");
        let err = Monitor::parse(parse("c,mode=readline", Some("chardev")).unwrap()).unwrap_err();
        assert_eq!(err, "Only QMP is supported");
    }
}
