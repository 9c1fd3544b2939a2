//! Names of INIT flag bits, for log lines like `flags=ASYNC_READ|BIG_WRITES`.

use crate::abi::*;
use core::fmt;

/// Every INIT flag with its kernel name (without `FUSE_`).
pub const INIT_FLAG_NAMES: [(u64, &str); 43] = [
    (FUSE_ASYNC_READ, "ASYNC_READ"),
    (FUSE_POSIX_LOCKS, "POSIX_LOCKS"),
    (FUSE_FILE_OPS, "FILE_OPS"),
    (FUSE_ATOMIC_O_TRUNC, "ATOMIC_O_TRUNC"),
    (FUSE_EXPORT_SUPPORT, "EXPORT_SUPPORT"),
    (FUSE_BIG_WRITES, "BIG_WRITES"),
    (FUSE_DONT_MASK, "DONT_MASK"),
    (FUSE_SPLICE_WRITE, "SPLICE_WRITE"),
    (FUSE_SPLICE_MOVE, "SPLICE_MOVE"),
    (FUSE_SPLICE_READ, "SPLICE_READ"),
    (FUSE_FLOCK_LOCKS, "FLOCK_LOCKS"),
    (FUSE_HAS_IOCTL_DIR, "HAS_IOCTL_DIR"),
    (FUSE_AUTO_INVAL_DATA, "AUTO_INVAL_DATA"),
    (FUSE_DO_READDIRPLUS, "DO_READDIRPLUS"),
    (FUSE_READDIRPLUS_AUTO, "READDIRPLUS_AUTO"),
    (FUSE_ASYNC_DIO, "ASYNC_DIO"),
    (FUSE_WRITEBACK_CACHE, "WRITEBACK_CACHE"),
    (FUSE_NO_OPEN_SUPPORT, "NO_OPEN_SUPPORT"),
    (FUSE_PARALLEL_DIROPS, "PARALLEL_DIROPS"),
    (FUSE_HANDLE_KILLPRIV, "HANDLE_KILLPRIV"),
    (FUSE_POSIX_ACL, "POSIX_ACL"),
    (FUSE_ABORT_ERROR, "ABORT_ERROR"),
    (FUSE_MAX_PAGES, "MAX_PAGES"),
    (FUSE_CACHE_SYMLINKS, "CACHE_SYMLINKS"),
    (FUSE_NO_OPENDIR_SUPPORT, "NO_OPENDIR_SUPPORT"),
    (FUSE_EXPLICIT_INVAL_DATA, "EXPLICIT_INVAL_DATA"),
    (FUSE_MAP_ALIGNMENT, "MAP_ALIGNMENT"),
    (FUSE_SUBMOUNTS, "SUBMOUNTS"),
    (FUSE_HANDLE_KILLPRIV_V2, "HANDLE_KILLPRIV_V2"),
    (FUSE_SETXATTR_EXT, "SETXATTR_EXT"),
    (FUSE_INIT_EXT, "INIT_EXT"),
    (FUSE_INIT_RESERVED, "INIT_RESERVED"),
    (FUSE_SECURITY_CTX, "SECURITY_CTX"),
    (FUSE_HAS_INODE_DAX, "HAS_INODE_DAX"),
    (FUSE_CREATE_SUPP_GROUP, "CREATE_SUPP_GROUP"),
    (FUSE_HAS_EXPIRE_ONLY, "HAS_EXPIRE_ONLY"),
    (FUSE_DIRECT_IO_ALLOW_MMAP, "DIRECT_IO_ALLOW_MMAP"),
    (FUSE_PASSTHROUGH, "PASSTHROUGH"),
    (FUSE_NO_EXPORT_SUPPORT, "NO_EXPORT_SUPPORT"),
    (FUSE_HAS_RESEND, "HAS_RESEND"),
    (FUSE_ALLOW_IDMAP, "ALLOW_IDMAP"),
    (FUSE_OVER_IO_URING, "OVER_IO_URING"),
    (FUSE_REQUEST_TIMEOUT, "REQUEST_TIMEOUT"),
];

/// Displays INIT flags as `NAME|NAME|0x...` (unknown bits in hex), no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagNames(pub u64);

impl fmt::Display for FlagNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        let mut sep = "";
        for (bit, name) in INIT_FLAG_NAMES.iter().filter(|(bit, _)| self.0 & bit != 0) {
            write!(f, "{sep}{name}")?;
            rest &= !bit;
            sep = "|";
        }
        match (rest, sep) {
            (0, "") => f.write_str("0"),
            (0, _) => Ok(()),
            (rest, sep) => write!(f, "{sep}{rest:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_and_unknown_bits() {
        assert_eq!(FlagNames(0).to_string(), "0");
        assert_eq!(
            FlagNames(FUSE_ASYNC_READ | FUSE_OVER_IO_URING).to_string(),
            "ASYNC_READ|OVER_IO_URING"
        );
        assert_eq!(
            FlagNames(FUSE_BIG_WRITES | 1 << 60).to_string(),
            "BIG_WRITES|0x1000000000000000"
        );
    }

    #[test]
    fn every_bit_is_named_once() {
        let all = INIT_FLAG_NAMES.iter().fold(0u64, |acc, (bit, _)| {
            assert_eq!(acc & bit, 0, "duplicate bit {bit:#x}");
            acc | bit
        });
        assert_eq!(all, (1 << 43) - 1);
    }
}
