//! The one SQE of FUSE over io_uring: `IORING_OP_URING_CMD` with a `fuse_uring_cmd_req`,
//! and for REGISTER the entry's two buffers as iovecs. Kept apart because it writes a
//! field the io-uring crate has no setter for.

use std::os::fd::RawFd;

use fuse::abi::fuse_uring_cmd_req;
use runtime::{opcode, squeue, types};
use zerocopy::IntoBytes;

/// Byte offset of `len` in `struct io_uring_sqe` (opcode 1, flags 1, ioprio 2, fd 4,
/// off 8, addr 8).
const SQE_LEN_AT: usize = 24;

/// A URING_CMD on the /dev/fuse fd `fd`: `cmd_op` (REGISTER or COMMIT_AND_FETCH) with
/// `req` in the command area, and `iovecs` (REGISTER only) as `addr`/`len`.
///
/// The iovecs must stay valid until the command is issued (the kernel copies them then);
/// the buffers they describe must stay valid until the entry's last completion, because
/// the kernel keeps writing requests into them after every COMMIT_AND_FETCH.
pub(crate) fn uring_cmd(
    fd: RawFd,
    cmd_op: u32,
    req: &fuse_uring_cmd_req,
    iovecs: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[..size_of::<fuse_uring_cmd_req>()].copy_from_slice(req.as_bytes());
    let mut build = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
    if let Some(iov) = iovecs {
        build = build.addr(Some(iov.as_ptr() as u64));
    }
    let mut entry = build.build();
    if iovecs.is_some() {
        set_len(&mut entry, 2);
    }
    entry
}

/// Writes the SQE's `len` field.
fn set_len(entry: &mut squeue::Entry128, len: u32) {
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `#[repr(C)] (Entry, [u8; 64])` and `Entry` is
    // `#[repr(C)] (io_uring_sqe)`, so the first 64 bytes are the SQE; viewing the 128
    // plain bytes as an array is valid, and this is the only reference to them.
    let bytes = unsafe { &mut *(entry as *mut squeue::Entry128).cast::<[u8; 128]>() };
    bytes[SQE_LEN_AT..SQE_LEN_AT + 4].copy_from_slice(&len.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_carries_two_iovecs_and_the_queue() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let req = fuse_uring_cmd_req {
            flags: 0,
            commit_id: 7,
            qid: 3,
            padding: [0; 6],
        };
        let entry = uring_cmd(5, 1, &req, Some(&iov));
        // SAFETY: as in `set_len`: 128 plain bytes, read only.
        let bytes = unsafe { &*(&entry as *const squeue::Entry128).cast::<[u8; 128]>() };
        assert_eq!(
            u32::from_ne_bytes(bytes[24..28].try_into().unwrap()),
            2,
            "len"
        );
        assert_eq!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(i32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 5, "fd");
        assert_eq!(
            u32::from_ne_bytes(bytes[8..12].try_into().unwrap()),
            1,
            "cmd_op"
        );
        // The command area starts at byte 48: commit_id at +8, qid at +16.
        assert_eq!(u64::from_ne_bytes(bytes[56..64].try_into().unwrap()), 7);
        assert_eq!(u16::from_ne_bytes(bytes[64..66].try_into().unwrap()), 3);
    }
}
