//! The source file's `stat` as FUSE attributes.
//!
//! Why in one place: GETATTR, SETATTR, LOOKUP, CREATE, MKDIR and every READDIRPLUS entry
//! answer with them, and they must agree (the kernel caches them for the timeouts given).
//! The inode number is the source's own (`st_ino`), so `ls -i` and `find -inum` show what
//! they show on the source; the node id the kernel uses to address requests is separate.

use fuse::abi::fuse_attr;

/// `st` as `fuse_attr`.
pub fn of_stat(st: &libc::stat) -> fuse_attr {
    fuse_attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: st.st_atime as u64,
        mtime: st.st_mtime as u64,
        ctime: st.st_ctime as u64,
        atimensec: st.st_atime_nsec as u32,
        mtimensec: st.st_mtime_nsec as u32,
        ctimensec: st.st_ctime_nsec as u32,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_the_source_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 5000]).unwrap();
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: stat is plain data; all-zero is valid and overwritten by the call.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is NUL-terminated and `st` a writable stat.
        assert_eq!(unsafe { libc::stat(c.as_ptr(), &mut st) }, 0);
        let a = of_stat(&st);
        assert_eq!(
            (a.ino, a.size, a.mode, a.nlink),
            (st.st_ino, 5000, st.st_mode, 1)
        );
        assert_eq!(
            (a.mtime, a.mtimensec),
            (st.st_mtime as u64, st.st_mtime_nsec as u32)
        );
        assert!(a.blocks >= 8, "5000 bytes take at least 8 sectors");
    }
}
