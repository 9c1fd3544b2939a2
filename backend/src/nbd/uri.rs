//! NBD URIs, in QEMU's forms (and the NBD project's `doc/uri.md`):
//! `nbd://HOST[:PORT]/EXPORT` (TCP, port 10809 by default; an IPv6 host in brackets) and
//! `nbd+unix:///EXPORT?socket=PATH` (a unix socket). The export name is the rest of the
//! path after the first `/`, percent-decoded, and may be empty. `nbds://` and
//! `nbds+unix://` are the same with TLS (the NBD project's forms; they need `--tls-creds`).
//! Anything else (other query parameters) is refused, naming what, rather than ignored.

use std::fmt;
use std::path::PathBuf;

/// The default NBD port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A TCP host (a name or an address; an IPv6 address without brackets) and port.
    Tcp {
        /// The host name or address.
        host: String,
        /// The port.
        port: u16,
    },
    /// A unix socket path.
    Unix(PathBuf),
}

/// A parsed NBD URI: the server and the export name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uri {
    /// Where to connect.
    pub address: Address,
    /// The export's name (may be empty: the server's default export).
    pub export: String,
    /// `nbds`: TLS is required.
    pub tls: bool,
}

impl fmt::Display for Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "s" } else { "" };
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)
            }
            Address::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export),
            Address::Unix(path) => {
                write!(
                    f,
                    "nbd{s}+unix:///{}?socket={}",
                    self.export,
                    path.display()
                )
            }
        }
    }
}

/// Whether `spec` is meant as an NBD URI (then [`parse`] says what is wrong with it).
pub fn is_nbd(spec: &str) -> bool {
    spec.starts_with("nbd:") || spec.starts_with("nbd+") || spec.starts_with("nbds")
}

/// What is wrong with an NBD URI; its text is one line, as the command line prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UriError {
    /// Neither `nbd[s]://` nor `nbd[s]+unix://`.
    Scheme,
    /// A query on `nbd[s]://`.
    TcpQuery,
    /// `nbd://` without a host.
    MissingHost,
    /// `[` of an IPv6 host never closed.
    UnclosedBracket,
    /// A port that is not a number (as written).
    Port(String),
    /// `nbd+unix://` without `?socket=PATH`.
    NoSocket,
    /// `nbd+unix://` with a host.
    UnixHost,
    /// A query parameter other than a non-empty `socket=` (as written).
    QueryParam(String),
    /// A `%` not followed by two hex digits, in this text.
    Escape(String),
    /// This text is not UTF-8 once decoded.
    NotUtf8(String),
}

impl std::fmt::Display for UriError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UriError::Scheme => f.write_str(
                "expected nbd[s]://HOST[:PORT]/EXPORT or nbd[s]+unix:///EXPORT?socket=PATH",
            ),
            UriError::TcpQuery => f.write_str("nbd[s]:// takes no query parameters"),
            UriError::MissingHost => f.write_str("missing host (nbd://HOST[:PORT]/EXPORT)"),
            UriError::UnclosedBracket => f.write_str("unclosed [ in host"),
            UriError::Port(p) => write!(f, "invalid port {p:?}"),
            UriError::NoSocket => f.write_str("nbd+unix:// needs ?socket=PATH"),
            UriError::UnixHost => {
                f.write_str("nbd+unix:// takes no host: nbd+unix:///EXPORT?socket=PATH")
            }
            UriError::QueryParam(p) => write!(f, "unknown or empty query parameter {p:?}"),
            UriError::Escape(t) => write!(f, "bad percent escape in {t:?}"),
            UriError::NotUtf8(t) => write!(f, "{t:?} is not UTF-8 once decoded"),
        }
    }
}

impl std::error::Error for UriError {}

/// Parses an NBD URI; the error says what is wrong in one line.
pub fn parse(spec: &str) -> Result<Uri, UriError> {
    let (tls, rest) = match spec.strip_prefix("nbds") {
        Some(rest) => (true, rest),
        None => (false, spec.strip_prefix("nbd").unwrap_or("")),
    };
    let mut uri = if let Some(rest) = rest.strip_prefix("://") {
        parse_tcp(rest)?
    } else if let Some(rest) = rest.strip_prefix("+unix://") {
        parse_unix(rest)?
    } else {
        return Err(UriError::Scheme);
    };
    uri.tls = tls;
    Ok(uri)
}

fn parse_tcp(rest: &str) -> Result<Uri, UriError> {
    if rest.contains('?') {
        return Err(UriError::TcpQuery);
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err(UriError::MissingHost);
    }
    Ok(Uri {
        address: Address::Tcp { host, port },
        export: decode(path)?,
        tls: false,
    })
}

fn split_host_port(authority: &str) -> Result<(String, u16), UriError> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or(UriError::UnclosedBracket)?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse().map_err(|_| UriError::Port(p.to_string()))?,
    };
    Ok((host.to_owned(), port))
}

fn parse_unix(rest: &str) -> Result<Uri, UriError> {
    let (before, query) = rest.split_once('?').ok_or(UriError::NoSocket)?;
    let path = before.strip_prefix('/').ok_or(UriError::UnixHost)?;
    let mut socket = None;
    for param in query.split('&') {
        match param.split_once('=') {
            Some(("socket", p)) if !p.is_empty() => socket = Some(PathBuf::from(decode(p)?)),
            _ => return Err(UriError::QueryParam(param.to_string())),
        }
    }
    Ok(Uri {
        address: Address::Unix(socket.ok_or(UriError::NoSocket)?),
        export: decode(path)?,
        tls: false,
    })
}

/// Percent-decoding (`%2F` is `/`).
fn decode(text: &str) -> Result<String, UriError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).unwrap_or("");
            let byte =
                u8::from_str_radix(hex, 16).map_err(|_| UriError::Escape(text.to_string()))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UriError::NotUtf8(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> Uri {
        let host = host.to_owned();
        Uri {
            address: Address::Tcp { host, port },
            export: export.to_owned(),
            tls: false,
        }
    }

    #[test]
    fn forms() {
        let good = [
            ("nbd://localhost/disk", tcp("localhost", 10809, "disk")),
            ("nbd://127.0.0.1:1234/a%2Fb", tcp("127.0.0.1", 1234, "a/b")),
            ("nbd://host", tcp("host", 10809, "")),
            ("nbd://host:7/", tcp("host", 7, "")),
            ("nbd://[::1]:99/x", tcp("::1", 99, "x")),
            ("nbd://[::1]/x", tcp("::1", 10809, "x")),
        ];
        for (text, uri) in good {
            assert_eq!(parse(text), Ok(uri), "{text}");
        }
        let unix = parse("nbd+unix:///exp?socket=/run/n.sock").unwrap();
        assert_eq!(unix.address, Address::Unix("/run/n.sock".into()));
        assert_eq!(unix.export, "exp");
        assert_eq!(unix.to_string(), "nbd+unix:///exp?socket=/run/n.sock");
        assert_eq!(parse("nbd+unix:///?socket=s").unwrap().export, "");
        let tls = parse("nbds://h:7/e").unwrap();
        assert_eq!(
            tls,
            Uri {
                tls: true,
                ..tcp("h", 7, "e")
            }
        );
        assert_eq!(tls.to_string(), "nbds://h:7/e");
        let tls = parse("nbds+unix:///e?socket=/s").unwrap();
        assert!(tls.tls && tls.address == Address::Unix("/s".into()));
        assert_eq!(tls.to_string(), "nbds+unix:///e?socket=/s");
    }

    #[test]
    fn errors() {
        let bad = [
            ("nbd://", "missing host"),
            ("nbd://h:x/e", "invalid port"),
            ("nbd://h/e?x=1", "no query"),
            ("nbd+unix:///e", "needs ?socket"),
            ("nbd+unix://host/e?socket=s", "takes no host"),
            ("nbd+unix:///e?socket=s&tls=1", "unknown or empty"),
            ("nbds+unix:///e", "needs ?socket"),
            ("nbd:h", "expected nbd[s]://"),
            ("nbds:h", "expected nbd[s]://"),
            ("nbd://h/%zz", "bad percent"),
        ];
        for (text, error) in bad {
            let got = parse(text).unwrap_err().to_string();
            assert!(got.contains(error), "{text}: {got}");
            assert!(is_nbd(text));
        }
        assert!(!is_nbd("/tmp/nbd.img") && !is_nbd("null:1G"));
    }
}
