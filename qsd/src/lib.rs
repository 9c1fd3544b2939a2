//! qemu-storage-daemon's interface, as one typed model: its command line (`--blockdev`,
//! `--export`, `--object`, `--chardev`, `--monitor`, ...) and its QMP monitor, so that
//! corofuse can stand in for it (`corofuse storage-daemon`, or the binary run under the
//! name `qemu-storage-daemon`).
//!
//! ```
//! use corofuse_qsd::{keyval, Blockdev, BlockExport};
//!
//! let (tree, kv) = keyval::parse_option("null-co,node-name=n,size=4096", Some("driver"))?;
//! let node = Blockdev::parse(tree, kv)?;
//! assert_eq!(node.driver_name(), "null-co");
//! let (tree, kv) = keyval::parse_option(
//!     r#"{"type": "fuse", "id": "e", "node-name": "n", "mountpoint": "/m"}"#,
//!     Some("type"),
//! )?;
//! assert_eq!(BlockExport::parse(tree, kv)?.id, "e");
//! # Ok::<(), String>(())
//! ```
//!
//! Why a crate of its own: the same option reaches the daemon as a keyval string on the
//! command line, as JSON on the command line, and as a QMP command's arguments; each
//! becomes the one model here ([`Blockdev`], [`BlockExport`], [`Object`]), which the
//! binary opens and serves through the same code as `corofuse mount`. Nothing here opens
//! a file or mounts anything.
//!
//! The types are written by hand for the subset corofuse serves rather than taken from
//! the `qapi-qmp` crate: that crate models all of QEMU's schema for a *client*
//! (deserialising with serde's error messages), while a stand-in must reject what it does
//! not serve with a sentence naming what it does, and must word every other error as
//! QEMU's input visitor does ([`fields`]), which serde derive cannot.
//!
//! Layout: [`keyval`] (QEMU's `a.b=1,,x` syntax), [`fields`] (typed members with QEMU's
//! errors), [`blockdev`], [`export`], [`object`] (the model), [`cli`] (the argument list),
//! [`qmp`] (the monitor protocol's framing and messages).

#![warn(missing_docs)]

pub mod blockdev;
pub mod cli;
pub mod export;
pub mod fields;
pub mod keyval;
pub mod object;
pub mod qmp;

pub use blockdev::{Backing, Blockdev, Child, Driver, SocketAddress};
pub use export::{AllowOther, BlockExport};
pub use object::{Chardev, Monitor, Object};
