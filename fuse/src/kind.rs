//! What each operation is, decided once: [`OpKind`], one per [`Operation`] variant, and
//! its properties, each an exhaustive `match` (no `_` arm).
//!
//! Why: a server needs to know things about an opcode before or beside serving it: the
//! transports whether its reply is built in the data buffer, the dispatch whether it takes
//! a reply at all, a file system whether it changes the tree on its caller's behalf, the
//! accounting which family it counts under. Kept as separate lists (`matches!` on a raw
//! opcode here, on an [`Operation`] there), an opcode added to the decoder but missed in
//! one list compiled and silently took the wrong branch. Here, a new [`Operation`]
//! variant fails to compile in [`Operation::kind`] until it has a kind, and a new kind
//! fails to compile in every property below until each is decided.
//!
//! The opcode of each kind is listed once, in the table that makes the enum
//! ([`OpKind::from_opcode`], [`OpKind::opcode`], [`OpKind::KNOWN`]); the decoder's
//! per-opcode match must agree with it, which the tests check by decoding every opcode.

use crate::abi::*;
use crate::request::Operation;

/// Makes [`OpKind`] and its opcode table from one list of `Kind = FUSE_OPCODE` rows.
macro_rules! op_kinds {
    ($($(#[$doc:meta])* $kind:ident = $opcode:ident,)*) => {
        /// The kind of an operation: one per [`Operation`] variant, without its arguments.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum OpKind {
            $($(#[$doc])* $kind,)*
            /// Any opcode the decoder does not know (ioctl, bmap, DAX mappings, CUSE...).
            Unknown,
        }

        impl OpKind {
            /// Every kind but [`OpKind::Unknown`], in opcode order.
            pub const KNOWN: &'static [OpKind] = &[$(OpKind::$kind,)*];

            /// The kind of requests with `opcode`.
            pub const fn from_opcode(opcode: u32) -> OpKind {
                match opcode {
                    $($opcode => OpKind::$kind,)*
                    _ => OpKind::Unknown,
                }
            }

            /// The opcode of this kind (`None` for [`OpKind::Unknown`]).
            pub const fn opcode(self) -> Option<u32> {
                match self {
                    $(OpKind::$kind => Some($opcode),)*
                    OpKind::Unknown => None,
                }
            }

            /// The kernel's name, without `FUSE_` (`"READ"`); `"UNKNOWN"` for the rest.
            pub fn name(self) -> &'static str {
                match self {
                    $(OpKind::$kind => &stringify!($opcode)["FUSE_".len()..],)*
                    OpKind::Unknown => "UNKNOWN",
                }
            }
        }
    };
}

op_kinds! {
    /// LOOKUP.
    Lookup = FUSE_LOOKUP,
    /// FORGET.
    Forget = FUSE_FORGET,
    /// GETATTR.
    Getattr = FUSE_GETATTR,
    /// SETATTR.
    Setattr = FUSE_SETATTR,
    /// READLINK.
    Readlink = FUSE_READLINK,
    /// SYMLINK.
    Symlink = FUSE_SYMLINK,
    /// MKNOD.
    Mknod = FUSE_MKNOD,
    /// MKDIR.
    Mkdir = FUSE_MKDIR,
    /// UNLINK.
    Unlink = FUSE_UNLINK,
    /// RMDIR.
    Rmdir = FUSE_RMDIR,
    /// RENAME.
    Rename = FUSE_RENAME,
    /// LINK.
    Link = FUSE_LINK,
    /// OPEN.
    Open = FUSE_OPEN,
    /// READ.
    Read = FUSE_READ,
    /// WRITE.
    Write = FUSE_WRITE,
    /// STATFS.
    Statfs = FUSE_STATFS,
    /// RELEASE.
    Release = FUSE_RELEASE,
    /// FSYNC.
    Fsync = FUSE_FSYNC,
    /// SETXATTR.
    Setxattr = FUSE_SETXATTR,
    /// GETXATTR.
    Getxattr = FUSE_GETXATTR,
    /// LISTXATTR.
    Listxattr = FUSE_LISTXATTR,
    /// REMOVEXATTR.
    Removexattr = FUSE_REMOVEXATTR,
    /// FLUSH.
    Flush = FUSE_FLUSH,
    /// INIT.
    Init = FUSE_INIT,
    /// OPENDIR.
    Opendir = FUSE_OPENDIR,
    /// READDIR.
    Readdir = FUSE_READDIR,
    /// RELEASEDIR.
    Releasedir = FUSE_RELEASEDIR,
    /// FSYNCDIR.
    Fsyncdir = FUSE_FSYNCDIR,
    /// GETLK.
    Getlk = FUSE_GETLK,
    /// SETLK.
    Setlk = FUSE_SETLK,
    /// SETLKW.
    Setlkw = FUSE_SETLKW,
    /// ACCESS.
    Access = FUSE_ACCESS,
    /// CREATE.
    Create = FUSE_CREATE,
    /// INTERRUPT.
    Interrupt = FUSE_INTERRUPT,
    /// DESTROY.
    Destroy = FUSE_DESTROY,
    /// POLL.
    Poll = FUSE_POLL,
    /// BATCH_FORGET.
    BatchForget = FUSE_BATCH_FORGET,
    /// FALLOCATE.
    Fallocate = FUSE_FALLOCATE,
    /// READDIRPLUS.
    Readdirplus = FUSE_READDIRPLUS,
    /// RENAME2.
    Rename2 = FUSE_RENAME2,
    /// LSEEK.
    Lseek = FUSE_LSEEK,
    /// COPY_FILE_RANGE.
    CopyFileRange = FUSE_COPY_FILE_RANGE,
    /// SYNCFS.
    Syncfs = FUSE_SYNCFS,
    /// TMPFILE.
    Tmpfile = FUSE_TMPFILE,
    /// STATX.
    Statx = FUSE_STATX,
    /// COPY_FILE_RANGE_64.
    CopyFileRange64 = FUSE_COPY_FILE_RANGE_64,
}

/// What a request is about, for statistics: the family it is counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// The connection and the kernel's references: INIT, DESTROY, INTERRUPT, FORGETs.
    Session,
    /// Names: looking up, making, linking, renaming, removing; READLINK.
    Names,
    /// A node's or the file system's attributes, and access checks.
    Attributes,
    /// Opening and releasing files and directories (CREATE and TMPFILE open too).
    Open,
    /// A file's bytes: READ, WRITE, FALLOCATE, LSEEK, COPY_FILE_RANGE.
    Data,
    /// Durability: FLUSH, FSYNC, FSYNCDIR, SYNCFS.
    Sync,
    /// Directory listings.
    Listing,
    /// Extended attributes.
    Xattrs,
    /// POSIX and flock locks.
    Locks,
    /// POLL, and opcodes the decoder does not know.
    Other,
}

impl OpKind {
    /// Whether the kernel waits for a reply: not to FORGET, BATCH_FORGET and INTERRUPT
    /// (an INTERRUPT may still be answered, with EAGAIN, but need not be).
    pub const fn replies(self) -> bool {
        use OpKind::*;
        match self {
            Forget | BatchForget | Interrupt => false,
            Lookup | Getattr | Setattr | Readlink | Symlink | Mknod | Mkdir | Unlink | Rmdir
            | Rename | Link | Open | Read | Write | Statfs | Release | Fsync | Setxattr
            | Getxattr | Listxattr | Removexattr | Flush | Init | Opendir | Readdir
            | Releasedir | Fsyncdir | Getlk | Setlk | Setlkw | Access | Create | Destroy | Poll
            | Fallocate | Readdirplus | Rename2 | Lseek | CopyFileRange | Syncfs | Tmpfile
            | Statx | CopyFileRange64 | Unknown => true,
        }
    }

    /// Whether the reply carries bytes of a length only the server knows, built in the
    /// transport's data buffer (page-aligned, at least `max_read`): READ data, a
    /// directory listing, a symlink's target, an extended attribute's value or names.
    /// Every other reply is a fixed struct or nothing.
    pub const fn needs_data_buffer(self) -> bool {
        use OpKind::*;
        match self {
            Read | Readdir | Readdirplus | Readlink | Getxattr | Listxattr => true,
            Lookup | Forget | Getattr | Setattr | Symlink | Mknod | Mkdir | Unlink | Rmdir
            | Rename | Link | Open | Write | Statfs | Release | Fsync | Setxattr | Removexattr
            | Flush | Init | Opendir | Releasedir | Fsyncdir | Getlk | Setlk | Setlkw | Access
            | Create | Interrupt | Destroy | Poll | BatchForget | Fallocate | Rename2 | Lseek
            | CopyFileRange | Syncfs | Tmpfile | Statx | CopyFileRange64 | Unknown => false,
        }
    }

    /// Whether the request changes the file system in a way that depends on who asks, so
    /// that a server acting for its callers makes it with the caller's credentials: it
    /// makes a node (which the caller then owns), a link or a rename (checked against
    /// the caller's rights in sticky directories), or changes attributes or extended
    /// attributes (whose rules, such as clearing set-group-ID, depend on the caller).
    pub const fn changes_as_caller(self) -> bool {
        use OpKind::*;
        match self {
            Create | Tmpfile | Mkdir | Mknod | Symlink | Link | Rename | Rename2 | Setattr
            | Setxattr | Removexattr => true,
            Lookup | Forget | Getattr | Readlink | Unlink | Rmdir | Open | Read | Write
            | Statfs | Release | Fsync | Getxattr | Listxattr | Flush | Init | Opendir
            | Readdir | Releasedir | Fsyncdir | Getlk | Setlk | Setlkw | Access | Interrupt
            | Destroy | Poll | BatchForget | Fallocate | Readdirplus | Lseek | CopyFileRange
            | Syncfs | Statx | CopyFileRange64 | Unknown => false,
        }
    }

    /// The family the request is counted under.
    pub const fn family(self) -> Family {
        use OpKind::*;
        match self {
            Init | Destroy | Interrupt | Forget | BatchForget => Family::Session,
            Lookup | Readlink | Symlink | Mknod | Mkdir | Unlink | Rmdir | Rename | Rename2
            | Link => Family::Names,
            Getattr | Setattr | Statx | Access | Statfs => Family::Attributes,
            Open | Release | Opendir | Releasedir | Create | Tmpfile => Family::Open,
            Read | Write | Fallocate | Lseek | CopyFileRange | CopyFileRange64 => Family::Data,
            Flush | Fsync | Fsyncdir | Syncfs => Family::Sync,
            Readdir | Readdirplus => Family::Listing,
            Setxattr | Getxattr | Listxattr | Removexattr => Family::Xattrs,
            Getlk | Setlk | Setlkw => Family::Locks,
            Poll | Unknown => Family::Other,
        }
    }
}

impl Operation<'_> {
    /// This operation's kind.
    pub const fn kind(&self) -> OpKind {
        match self {
            Operation::Init { .. } => OpKind::Init,
            Operation::Getattr { .. } => OpKind::Getattr,
            Operation::Setattr { .. } => OpKind::Setattr,
            Operation::Open { .. } => OpKind::Open,
            Operation::Release { .. } => OpKind::Release,
            Operation::Flush { .. } => OpKind::Flush,
            Operation::Fsync { .. } => OpKind::Fsync,
            Operation::Read { .. } => OpKind::Read,
            Operation::Write { .. } => OpKind::Write,
            Operation::Fallocate { .. } => OpKind::Fallocate,
            Operation::Lseek { .. } => OpKind::Lseek,
            Operation::Statfs => OpKind::Statfs,
            Operation::Lookup { .. } => OpKind::Lookup,
            Operation::Interrupt { .. } => OpKind::Interrupt,
            Operation::Statx { .. } => OpKind::Statx,
            Operation::Forget { .. } => OpKind::Forget,
            Operation::BatchForget { .. } => OpKind::BatchForget,
            Operation::Destroy => OpKind::Destroy,
            Operation::Readlink => OpKind::Readlink,
            Operation::Symlink { .. } => OpKind::Symlink,
            Operation::Mknod { .. } => OpKind::Mknod,
            Operation::Mkdir { .. } => OpKind::Mkdir,
            Operation::Unlink { .. } => OpKind::Unlink,
            Operation::Rmdir { .. } => OpKind::Rmdir,
            Operation::Rename { .. } => OpKind::Rename,
            Operation::Rename2 { .. } => OpKind::Rename2,
            Operation::Link { .. } => OpKind::Link,
            Operation::Create { .. } => OpKind::Create,
            Operation::Tmpfile { .. } => OpKind::Tmpfile,
            Operation::Opendir { .. } => OpKind::Opendir,
            Operation::Readdir { .. } => OpKind::Readdir,
            Operation::Readdirplus { .. } => OpKind::Readdirplus,
            Operation::Releasedir { .. } => OpKind::Releasedir,
            Operation::Fsyncdir { .. } => OpKind::Fsyncdir,
            Operation::Setxattr { .. } => OpKind::Setxattr,
            Operation::Getxattr { .. } => OpKind::Getxattr,
            Operation::Listxattr { .. } => OpKind::Listxattr,
            Operation::Removexattr { .. } => OpKind::Removexattr,
            Operation::Access { .. } => OpKind::Access,
            Operation::Getlk { .. } => OpKind::Getlk,
            Operation::Setlk { .. } => OpKind::Setlk,
            Operation::Setlkw { .. } => OpKind::Setlkw,
            Operation::CopyFileRange { .. } => OpKind::CopyFileRange,
            Operation::CopyFileRange64 { .. } => OpKind::CopyFileRange64,
            Operation::Poll { .. } => OpKind::Poll,
            Operation::Syncfs { .. } => OpKind::Syncfs,
            Operation::Unknown { .. } => OpKind::Unknown,
        }
    }
}

#[cfg(test)]
#[path = "kind_tests.rs"]
mod tests;
