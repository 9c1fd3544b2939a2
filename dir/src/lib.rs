//! corofuse's directory export: a passthrough of a source directory tree, served by the
//! same transports as the image export (`corofuse mount-dir`, issue 10). This crate holds
//! what such a file system keeps about the tree, apart from the FUSE protocol:
//!
//! - [`inodes`]: the node table (an `O_PATH` handle per node, lookup counts, identity by
//!   device and inode number so hard links are one node); [`nodefd`]: the budget of node
//!   descriptors kept open, the colder ones reopened from file handles;
//! - [`dirstream`]: one open directory's listing, linear however the kernel splits it;
//! - [`tree`]: each operation on the tree by node id (mkdir, rename, setattr, xattrs...),
//!   with the source file system's errnos, and the permission model;
//! - [`handles`]: open files and directories by file handle; [`attr`]: `stat` as FUSE
//!   attributes; [`caller`]: the capabilities of a request's caller, where the daemon
//!   must decide for it; [`locks`]: POSIX and flock locks taken on the source per lock
//!   owner; [`fresh`]: attributes the kernel must ask for again (changes it did not see
//!   go through a request);
//! - `sys`: the `*at` system calls on the tree's descriptors (the crate's only unsafe code).
//!
//! - [`fs`]: [`DirFs`], all of the above as a `transport::FileSystem` (requests decoded
//!   by `fuse`, data through `runtime::Ctx`), which every transport can serve (the `server`
//!   crate mounts and serves it, for `corofuse mount-dir`, the tests and the benches);
//!   `fs.rs` keeps its state and dispatch table, and each family of requests (entries,
//!   attributes, open, data, directories, xattrs, locks) is answered in `fs/`.
//!
//! Depends on libc, log, slab, zerocopy, `fuse` (the protocol), `transport` (the
//! FileSystem trait) and `runtime` (for `Ctx`, the I/O context): no block backend, no
//! block format. Mounted by `corofuse mount-dir`.

pub mod attr;
pub mod caller;
pub mod creds;
pub mod dirstream;
pub mod fresh;
pub mod fs;
pub mod handles;
pub mod inodes;
pub mod locks;
pub mod nodefd;
pub mod offload;
mod sys;
pub mod tree;

pub use dirstream::{DirEntry, DirStream, StreamStats};
pub use fs::{Cache, DirFs, DirOptions, DirStats, ListingStats, MetadataPolicy, PassthroughPolicy};
pub use handles::{Backed, Handles, Open};
pub use inodes::{Entry, Inode, Inodes, ROOT};
pub use nodefd::DescriptorStats;
pub use tree::{SetAttr, Time, Tree};
