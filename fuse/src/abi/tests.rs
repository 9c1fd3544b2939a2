//! Layout checks against the kernel header (`include/uapi/linux/fuse.h`, 7.45).

use super::*;
use core::mem::{align_of, offset_of, size_of};

/// `sizeof` of every struct, as computed from the C header on x86_64.
#[test]
fn struct_sizes_match_the_header() {
    assert_eq!(size_of::<fuse_in_header>(), 40);
    assert_eq!(size_of::<fuse_out_header>(), 16);
    assert_eq!(size_of::<fuse_init_in>(), 64);
    assert_eq!(size_of::<fuse_init_out>(), 64);
    assert_eq!(size_of::<fuse_attr>(), 88);
    assert_eq!(size_of::<fuse_getattr_in>(), 16);
    assert_eq!(size_of::<fuse_attr_out>(), 104);
    assert_eq!(size_of::<fuse_entry_out>(), 128);
    assert_eq!(size_of::<fuse_setattr_in>(), 88);
    assert_eq!(size_of::<fuse_open_in>(), 8);
    assert_eq!(size_of::<fuse_open_out>(), 16);
    assert_eq!(size_of::<fuse_release_in>(), 24);
    assert_eq!(size_of::<fuse_flush_in>(), 24);
    assert_eq!(size_of::<fuse_fsync_in>(), 16);
    assert_eq!(size_of::<fuse_read_in>(), 40);
    assert_eq!(size_of::<fuse_write_in>(), 40);
    assert_eq!(size_of::<fuse_write_out>(), 8);
    assert_eq!(size_of::<fuse_fallocate_in>(), 32);
    assert_eq!(size_of::<fuse_lseek_in>(), 24);
    assert_eq!(size_of::<fuse_lseek_out>(), 8);
    assert_eq!(size_of::<fuse_kstatfs>(), 80);
    assert_eq!(size_of::<fuse_statfs_out>(), 80);
    assert_eq!(size_of::<fuse_interrupt_in>(), 8);
    assert_eq!(size_of::<fuse_forget_in>(), 8);
    assert_eq!(size_of::<fuse_forget_one>(), 16);
    assert_eq!(size_of::<fuse_batch_forget_in>(), 8);
    assert_eq!(size_of::<fuse_statx_in>(), 24);
    assert_eq!(size_of::<fuse_sx_time>(), 16);
    assert_eq!(size_of::<fuse_statx>(), 256);
    assert_eq!(size_of::<fuse_statx_out>(), 288);
    assert_eq!(size_of::<fuse_file_lock>(), 24);
    assert_eq!(size_of::<fuse_mknod_in>(), 16);
    assert_eq!(size_of::<fuse_mkdir_in>(), 8);
    assert_eq!(size_of::<fuse_rename_in>(), 8);
    assert_eq!(size_of::<fuse_rename2_in>(), 16);
    assert_eq!(size_of::<fuse_link_in>(), 8);
    assert_eq!(size_of::<fuse_create_in>(), 16);
    assert_eq!(size_of::<fuse_setxattr_in>(), 16);
    assert_eq!(size_of::<fuse_getxattr_in>(), 8);
    assert_eq!(size_of::<fuse_getxattr_out>(), 8);
    assert_eq!(size_of::<fuse_lk_in>(), 48);
    assert_eq!(size_of::<fuse_lk_out>(), 24);
    assert_eq!(size_of::<fuse_access_in>(), 8);
    assert_eq!(size_of::<fuse_dirent>(), 24);
    assert_eq!(size_of::<fuse_direntplus>(), 152);
    assert_eq!(size_of::<fuse_copy_file_range_in>(), 56);
    assert_eq!(size_of::<fuse_copy_file_range_out>(), 8);
    assert_eq!(size_of::<fuse_poll_in>(), 24);
    assert_eq!(size_of::<fuse_poll_out>(), 8);
    assert_eq!(size_of::<fuse_syncfs_in>(), 8);
    assert_eq!(size_of::<fuse_uring_ent_in_out>(), 32);
    assert_eq!(size_of::<fuse_uring_req_header>(), 288);
    assert_eq!(size_of::<fuse_uring_cmd_req>(), 24);
}

/// The header's compat sizes are prefixes of the current structs.
#[test]
fn compat_sizes_are_field_boundaries() {
    assert_eq!(offset_of!(fuse_init_in, flags2), FUSE_COMPAT_INIT_IN_SIZE);
    assert_eq!(
        offset_of!(fuse_init_out, max_readahead),
        FUSE_COMPAT_INIT_OUT_SIZE
    );
    assert_eq!(
        offset_of!(fuse_init_out, time_gran),
        FUSE_COMPAT_22_INIT_OUT_SIZE
    );
    assert_eq!(offset_of!(fuse_init_out, flags2), 32);
    assert_eq!(offset_of!(fuse_in_header, total_extlen), 36);
    assert_eq!(offset_of!(fuse_uring_req_header, ring_ent_in_out), 256);
    assert_eq!(
        offset_of!(fuse_setxattr_in, setxattr_flags),
        FUSE_COMPAT_SETXATTR_IN_SIZE
    );
    assert_eq!(offset_of!(fuse_mknod_in, umask), FUSE_COMPAT_MKNOD_IN_SIZE);
}

/// `offsetof(struct fuse_dirent, name)` and `offsetof(struct fuse_direntplus,
/// dirent.name)`, and the record alignment macro.
#[test]
fn dirent_layout() {
    assert_eq!(FUSE_NAME_OFFSET, 24);
    assert_eq!(FUSE_NAME_OFFSET_DIRENTPLUS, 152);
    assert_eq!(offset_of!(fuse_direntplus, dirent), 128);
    assert_eq!(offset_of!(fuse_dirent, r#type), 20);
    assert_eq!(offset_of!(fuse_lk_in, lk_flags), 40);
    let aligned: Vec<usize> = [0, 1, 7, 8, 9, 25].map(FUSE_DIRENT_ALIGN).to_vec();
    assert_eq!(aligned, [0, 8, 8, 8, 16, 32]);
}

/// The decoder views 8-byte aligned buffers; no struct may need more.
#[test]
fn alignment_is_at_most_eight() {
    assert_eq!(align_of::<fuse_in_header>(), 8);
    assert_eq!(align_of::<fuse_write_in>(), 8);
    assert_eq!(align_of::<fuse_init_in>(), 4);
    assert!(align_of::<fuse_uring_req_header>() <= 8);
}

/// `_IOR(229, 0, uint32_t)`, `_IOW(229, 1, struct fuse_backing_map)`, `_IOW(229, 2,
/// uint32_t)` and `_IO(229, 3)` from `<asm-generic/ioctl.h>`.
#[test]
fn ioctl_numbers() {
    const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> u32 {
        (dir << 30) | (size << 16) | (ty << 8) | nr
    }
    assert_eq!(FUSE_DEV_IOC_CLONE, ioc(2, 229, 0, 4));
    let map = size_of::<fuse_backing_map>() as u32;
    assert_eq!(map, 16);
    assert_eq!(FUSE_DEV_IOC_BACKING_OPEN, ioc(1, 229, 1, map));
    assert_eq!(FUSE_DEV_IOC_BACKING_CLOSE, ioc(1, 229, 2, 4));
    assert_eq!(FUSE_DEV_IOC_SYNC_INIT, ioc(0, 229, 3, 0));
}

/// `struct fuse_notify_inval_inode_out` is 24 bytes, as in the kernel header.
#[test]
fn notify_inval_inode_is_24_bytes() {
    assert_eq!(size_of::<fuse_notify_inval_inode_out>(), 24);
}

/// FUSE_OVER_IO_URING is bit 9 of `flags2`.
#[test]
fn high_init_flags_live_in_flags2() {
    assert_eq!(FUSE_OVER_IO_URING >> 32, 1 << 9);
    assert_eq!(FUSE_PASSTHROUGH >> 32, 1 << 5);
    assert_eq!(FUSE_INIT_EXT, 1 << 30);
}
