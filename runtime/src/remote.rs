//! Where a call on a file may wait on another machine or process: the file systems whose
//! waits have no bound a loop could afford to block through.
//!
//! Why in the runtime: a loop may run a call on its own thread only where the call cannot
//! stall it (`Co::block_while_idle`, `Ctx::Blocking`); whoever decides that for a file
//! (the directory export for its source, a block backend for its image) asks here.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `fstatfs(2)`'s `f_type` of the network and FUSE file systems, with their names.
const REMOTE: [(i64, &str); 12] = [
    (0x6969, "NFS"),
    (0xFE53_4D42, "SMB2"),
    (0xFF53_4D42, "CIFS"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9p"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "kAFS"),
    (0x7375_7245, "Coda"),
    (0x0BD0_0BD0, "Lustre"),
    (0x1366_1366, "OrangeFS"),
    (0x0116_1970, "GFS2"),
];

/// The name of the network or FUSE file system `fd` is on, or `None` for any other (or if
/// `fstatfs(2)` fails): where a call may wait on another machine or process.
pub fn remote_file_system(fd: BorrowedFd<'_>) -> Option<&'static str> {
    // SAFETY: statfs is plain data, filled by the kernel below.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for the call and `st` a writable statfs.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    let kind = st.f_type as i64;
    REMOTE
        .iter()
        .find(|(magic, _)| *magic == kind)
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_local_file_is_not_remote_and_dev_fuse_s_mounts_are() {
        let here = std::fs::File::open("/proc/self/exe").unwrap();
        assert_eq!(remote_file_system(here.as_fd()), None);
        // Any FUSE mount of this machine (a test daemon's, if one runs): FUSE.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        for line in mounts.lines().filter(|l| l.contains(" fuse")) {
            let Some(path) = line.split(' ').nth(1) else {
                continue;
            };
            if let Ok(f) = std::fs::File::open(path) {
                assert_eq!(remote_file_system(f.as_fd()), Some("FUSE"), "{line}");
            }
        }
    }
}
