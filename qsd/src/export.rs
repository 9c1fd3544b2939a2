//! `--export` and QMP `block-export-add` (qapi/block-export.json `BlockExportOptions`):
//! corofuse serves `type=fuse`; the other types QEMU has are recognised and refused with
//! a sentence naming what is supported.

use serde::Serialize;
use serde_json::Value;

use crate::fields::Fields;

/// QEMU's export types.
const QEMU_TYPES: &[&str] = &["nbd", "vhost-user-blk", "fuse", "vduse-blk"];

/// `allow-other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum AllowOther {
    /// `off`.
    Off,
    /// `on`.
    On,
    /// `auto` (the default): on if the mount allows it. corofuse mounts as root, where it
    /// always does, and otherwise without it.
    Auto,
}

/// One FUSE export.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlockExport {
    /// `id`.
    pub id: String,
    /// `node-name`: the node exported.
    pub node_name: String,
    /// `writable` (default off).
    pub writable: bool,
    /// `mountpoint`: an existing regular file.
    pub mountpoint: String,
    /// `growable` (default off).
    pub growable: bool,
    /// `allow-other`.
    pub allow_other: AllowOther,
    /// `iothread` (one, or a list `iothread.0=...`): the event loops serving it.
    pub iothreads: Vec<String>,
    /// `fixed-iothread`: accepted (corofuse never moves an export between loops).
    pub fixed_iothread: bool,
}

impl BlockExport {
    /// Reads `--export`'s or `block-export-add`'s arguments.
    pub fn parse(value: Value, keyval: bool) -> Result<BlockExport, String> {
        let mut f = Fields::new(value, keyval)?;
        let kind = f.req_str("type")?;
        if !QEMU_TYPES.contains(&kind.as_str()) {
            return Err(f.rejects("type", &kind));
        }
        let id = f.req_str("id")?;
        if kind != "fuse" {
            return Err(format!(
                "Export type '{kind}' is not supported by corofuse (supported: fuse)"
            ));
        }
        let node_name = f.req_str("node-name")?;
        let writable = f.bool("writable")?.unwrap_or(false);
        f.bool("writethrough")?;
        let iothreads = match f.take("iothread") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(format!(
                        "Invalid parameter type for '{}', expected: string",
                        f.name("iothread")
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(format!(
                    "Invalid parameter type for '{}', expected: StrOrNull",
                    f.name("iothread")
                ))
            }
        };
        let fixed_iothread = f.bool("fixed-iothread")?.unwrap_or(false);
        let mountpoint = f.req_str("mountpoint")?;
        let growable = f.bool("growable")?.unwrap_or(false);
        let allow_other = match f.choice("allow-other", &["off", "on", "auto"])?.as_deref() {
            Some("off") => AllowOther::Off,
            Some("on") => AllowOther::On,
            _ => AllowOther::Auto,
        };
        f.finish()?;
        Ok(BlockExport {
            id,
            node_name,
            writable,
            mountpoint,
            growable,
            allow_other,
            iothreads,
            fixed_iothread,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyval;

    fn parse(text: &str) -> Result<BlockExport, String> {
        let (v, kv) = keyval::parse_option(text, Some("type"))?;
        BlockExport::parse(v, kv)
    }

    #[test]
    fn fuse_with_its_keys() {
        let e = parse("fuse,id=e,node-name=n,mountpoint=/m,writable=on,allow-other=off,iothread.0=a,iothread.1=b")
            .unwrap();
        assert_eq!(e.iothreads, ["a", "b"]);
        assert!(e.writable && !e.growable);
        assert_eq!(e.allow_other, AllowOther::Off);
        assert_eq!(
            parse("fuse,id=e,node-name=n,mountpoint=/m,iothread=x")
                .unwrap()
                .iothreads,
            ["x"]
        );
    }

    #[test]
    fn errors_are_qemus_and_other_types_are_named() {
        let err = |t| parse(t).unwrap_err();
        assert_eq!(err("id=e,node-name=n"), "Parameter 'type' is missing");
        assert_eq!(
            err("type=foo,id=e"),
            "Parameter 'type' does not accept value 'foo'"
        );
        assert_eq!(err("fuse,node-name=n"), "Parameter 'id' is missing");
        assert_eq!(
            err("fuse,id=e,node-name=n"),
            "Parameter 'mountpoint' is missing"
        );
        assert_eq!(
            err("fuse,id=e,node-name=n,mountpoint=/m,allow-other=maybe"),
            "Parameter 'allow-other' does not accept value 'maybe'"
        );
        assert_eq!(
            err("fuse,id=e,node-name=n,mountpoint=/m,bogus=1"),
            "Parameter 'bogus' is unexpected"
        );
        assert_eq!(
            err("nbd,id=e,node-name=n"),
            "Export type 'nbd' is not supported by corofuse (supported: fuse)"
        );
    }
}
