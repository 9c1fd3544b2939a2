//! One log line per request: `Display` for [`Request`] and [`Operation`].
//!
//! The format is `FUSE(unique) OPNAME key=value...`, e.g.
//! `FUSE(  42) READ fh=7 off=4096 len=4096`, with `node=N` added when the
//! request is not about the root. Names are quoted with non-ASCII bytes and
//! quotes escaped, so a hostile name cannot forge a log line. Formatting
//! never allocates, so a `log::debug!("{req}")` costs nothing when debug
//! logging is off.

use crate::abi::{
    fuse_copy_file_range_in, fuse_create_in, fuse_lk_in, fuse_read_in, fuse_write_in, FUSE_BMAP,
    FUSE_IOCTL, FUSE_NOTIFY_REPLY, FUSE_REMOVEMAPPING, FUSE_ROOT_ID, FUSE_SETUPMAPPING,
};
use crate::kind::OpKind;
use crate::request::{Operation, Request, WriteData};
use core::fmt;
use std::ffi::CStr;

/// The kernel's name for an opcode, without the `FUSE_` prefix: a decoded kind's
/// ([`OpKind::name`]), or one of the opcodes the decoder leaves [`OpKind::Unknown`].
pub fn opcode_name(opcode: u32) -> Option<&'static str> {
    match OpKind::from_opcode(opcode) {
        OpKind::Unknown => match opcode {
            FUSE_BMAP => Some("BMAP"),
            FUSE_IOCTL => Some("IOCTL"),
            FUSE_NOTIFY_REPLY => Some("NOTIFY_REPLY"),
            FUSE_SETUPMAPPING => Some("SETUPMAPPING"),
            FUSE_REMOVEMAPPING => Some("REMOVEMAPPING"),
            _ => None,
        },
        kind => Some(kind.name()),
    }
}

impl fmt::Display for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FUSE({:4}) ", self.unique)?;
        if self.nodeid != FUSE_ROOT_ID && self.nodeid != 0 {
            write!(f, "node={} ", self.nodeid)?;
        }
        fmt::Display::fmt(&self.op, f)
    }
}

impl fmt::Display for Operation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operation::Init { arg } => write!(
                f,
                "INIT kernel {}.{} max_readahead={} flags={:#x} flags2={:#x}",
                arg.major, arg.minor, arg.max_readahead, arg.flags, arg.flags2
            ),
            Operation::Getattr { arg } => {
                write!(f, "GETATTR flags={:#x} fh={}", arg.getattr_flags, arg.fh)
            }
            Operation::Setattr { arg } => {
                write!(f, "SETATTR valid={:#x} size={}", arg.valid, arg.size)
            }
            Operation::Open { arg } => write!(f, "OPEN flags={:#o}", arg.flags),
            Operation::Release { arg } => write!(f, "RELEASE fh={}", arg.fh),
            Operation::Flush { arg } => write!(f, "FLUSH fh={}", arg.fh),
            Operation::Fsync { arg } => {
                write!(f, "FSYNC fh={} flags={:#x}", arg.fh, arg.fsync_flags)
            }
            Operation::Read { arg } => fmt_read(f, "READ", arg),
            Operation::Write { arg, data } => fmt_write(f, arg, data),
            Operation::Fallocate { arg } => {
                write!(
                    f,
                    "FALLOCATE mode={:#x} off={} len={}",
                    arg.mode, arg.offset, arg.length
                )
            }
            Operation::Lseek { arg } => write!(f, "LSEEK off={} whence={}", arg.offset, arg.whence),
            Operation::Statfs => f.write_str("STATFS"),
            Operation::Lookup { name } => write!(f, "LOOKUP {}", Name(name)),
            Operation::Interrupt { arg } => write!(f, "INTERRUPT unique={}", arg.unique),
            Operation::Statx { arg } => {
                write!(f, "STATX mask={:#x} flags={:#x}", arg.sx_mask, arg.sx_flags)
            }
            Operation::Forget { arg } => write!(f, "FORGET nlookup={}", arg.nlookup),
            Operation::BatchForget { nodes, .. } => write!(f, "BATCH_FORGET count={}", nodes.len()),
            Operation::Destroy => f.write_str("DESTROY"),
            Operation::Readlink => f.write_str("READLINK"),
            Operation::Symlink { name, target } => {
                write!(f, "SYMLINK {} -> {}", Name(name), Name(target))
            }
            Operation::Mknod { arg, name } => write!(
                f,
                "MKNOD {} mode={:#o} rdev={:#x} umask={:#o}",
                Name(name),
                arg.mode,
                arg.rdev,
                arg.umask
            ),
            Operation::Mkdir { arg, name } => write!(
                f,
                "MKDIR {} mode={:#o} umask={:#o}",
                Name(name),
                arg.mode,
                arg.umask
            ),
            Operation::Unlink { name } => write!(f, "UNLINK {}", Name(name)),
            Operation::Rmdir { name } => write!(f, "RMDIR {}", Name(name)),
            Operation::Rename { arg, name, newname } => {
                write!(
                    f,
                    "RENAME {} -> dir={} {}",
                    Name(name),
                    arg.newdir,
                    Name(newname)
                )
            }
            Operation::Rename2 { arg, name, newname } => write!(
                f,
                "RENAME2 {} -> dir={} {} flags={:#x}",
                Name(name),
                arg.newdir,
                Name(newname),
                arg.flags
            ),
            Operation::Link { arg, newname } => {
                write!(f, "LINK node {} as {}", arg.oldnodeid, Name(newname))
            }
            Operation::Create { arg, name } => fmt_create(f, "CREATE", arg, name),
            Operation::Tmpfile { arg, name } => fmt_create(f, "TMPFILE", arg, name),
            Operation::Opendir { arg } => write!(f, "OPENDIR flags={:#o}", arg.flags),
            Operation::Readdir { arg } => fmt_read(f, "READDIR", arg),
            Operation::Readdirplus { arg } => fmt_read(f, "READDIRPLUS", arg),
            Operation::Releasedir { arg } => write!(f, "RELEASEDIR fh={}", arg.fh),
            Operation::Fsyncdir { arg } => {
                write!(f, "FSYNCDIR fh={} flags={:#x}", arg.fh, arg.fsync_flags)
            }
            Operation::Setxattr { arg, name, .. } => write!(
                f,
                "SETXATTR {} size={} flags={:#x} setxattr_flags={:#x}",
                Name(name),
                arg.size,
                arg.flags,
                arg.setxattr_flags
            ),
            Operation::Getxattr { arg, name } => {
                write!(f, "GETXATTR {} size={}", Name(name), arg.size)
            }
            Operation::Listxattr { arg } => write!(f, "LISTXATTR size={}", arg.size),
            Operation::Removexattr { name } => write!(f, "REMOVEXATTR {}", Name(name)),
            Operation::Access { arg } => write!(f, "ACCESS mask={:#o}", arg.mask),
            Operation::Getlk { arg } => fmt_lk(f, "GETLK", arg),
            Operation::Setlk { arg } => fmt_lk(f, "SETLK", arg),
            Operation::Setlkw { arg } => fmt_lk(f, "SETLKW", arg),
            Operation::CopyFileRange { arg } => fmt_copy(f, "COPY_FILE_RANGE", arg),
            Operation::CopyFileRange64 { arg } => fmt_copy(f, "COPY_FILE_RANGE_64", arg),
            Operation::Poll { arg } => write!(f, "POLL fh={} events={:#x}", arg.fh, arg.events),
            Operation::Syncfs { .. } => f.write_str("SYNCFS"),
            Operation::Unknown { opcode } => match opcode_name(*opcode) {
                Some(name) => write!(f, "{name} (unsupported)"),
                None => write!(f, "opcode {opcode} (unknown)"),
            },
        }
    }
}

/// A name, quoted and escaped.
struct Name<'a>(&'a CStr);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.to_bytes().escape_ascii())
    }
}

fn fmt_read(f: &mut fmt::Formatter<'_>, name: &str, arg: &fuse_read_in) -> fmt::Result {
    write!(
        f,
        "{name} fh={} off={} len={}",
        arg.fh, arg.offset, arg.size
    )
}

fn fmt_create(
    f: &mut fmt::Formatter<'_>,
    op: &str,
    arg: &fuse_create_in,
    name: &CStr,
) -> fmt::Result {
    write!(
        f,
        "{op} {} flags={:#o} mode={:#o} umask={:#o}",
        Name(name),
        arg.flags,
        arg.mode,
        arg.umask
    )
}

fn fmt_copy(f: &mut fmt::Formatter<'_>, op: &str, arg: &fuse_copy_file_range_in) -> fmt::Result {
    write!(
        f,
        "{op} fh={} off={} -> node={} fh={} off={} len={}",
        arg.fh_in, arg.off_in, arg.nodeid_out, arg.fh_out, arg.off_out, arg.len
    )
}

fn fmt_lk(f: &mut fmt::Formatter<'_>, name: &str, arg: &fuse_lk_in) -> fmt::Result {
    write!(
        f,
        "{name} fh={} owner={:#x} type={} range={}..={} flags={:#x}",
        arg.fh, arg.owner, arg.lk.r#type, arg.lk.start, arg.lk.end, arg.lk_flags
    )
}

fn fmt_write(f: &mut fmt::Formatter<'_>, arg: &fuse_write_in, data: &WriteData<'_>) -> fmt::Result {
    write!(f, "WRITE fh={} off={} len={}", arg.fh, arg.offset, arg.size)?;
    if data.uses_tail() {
        write!(
            f,
            " (in place {} + spilled {})",
            data.parts().0.len(),
            data.parts().1.len()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::*;

    #[test]
    fn opcode_names_follow_the_kernel_enum() {
        assert_eq!(opcode_name(FUSE_LOOKUP), Some("LOOKUP"));
        assert_eq!(opcode_name(FUSE_FSYNC), Some("FSYNC"));
        assert_eq!(opcode_name(FUSE_BATCH_FORGET), Some("BATCH_FORGET"));
        assert_eq!(opcode_name(FUSE_STATX), Some("STATX"));
        assert_eq!(
            opcode_name(FUSE_COPY_FILE_RANGE_64),
            Some("COPY_FILE_RANGE_64")
        );
        assert_eq!(opcode_name(FUSE_IOCTL), Some("IOCTL"));
        assert_eq!(opcode_name(FUSE_REMOVEMAPPING), Some("REMOVEMAPPING"));
        assert_eq!(opcode_name(7), None);
        assert_eq!(opcode_name(19), None);
        assert_eq!(opcode_name(54), None);
        assert_eq!(opcode_name(u32::MAX), None);
    }

    #[test]
    fn lookup_names_are_escaped() {
        let name = c"a\"b\n\xff";
        let req = Request {
            unique: 3,
            nodeid: 5,
            uid: 0,
            gid: 0,
            pid: 0,
            len: 0,
            opcode: 1,
            op: Operation::Lookup { name },
        };
        assert_eq!(req.to_string(), r#"FUSE(   3) node=5 LOOKUP "a\"b\n\xff""#);
    }
}
