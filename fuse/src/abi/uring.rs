//! Structs of FUSE over io_uring (7.42, Linux 6.14+), for a future transport.
//!
//! A registered entry is two buffers: a 288-byte [`fuse_uring_req_header`] and
//! a payload buffer. The SQE's 80-byte command area holds a
//! [`fuse_uring_cmd_req`].

use super::consts::{FUSE_URING_IN_OUT_HEADER_SZ, FUSE_URING_OP_IN_OUT_SZ};
use super::structs::abi_structs;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

abi_structs! {
    /// Ring entry bookkeeping, part of [`fuse_uring_req_header`].
    pub struct fuse_uring_ent_in_out {
        pub flags: u64,
        /// Id to quote in COMMIT_AND_FETCH (the request's `unique`).
        pub commit_id: u64,
        /// Bytes used in the payload buffer.
        pub payload_sz: u32,
        pub padding: u32,
        pub reserved: u64,
    }

    /// Per-entry header buffer shared with the kernel.
    pub struct fuse_uring_req_header {
        /// `fuse_in_header` (request) or `fuse_out_header` (reply); `char[]` in C.
        pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
        /// The opcode's first argument struct; `char[]` in C.
        pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
        pub ring_ent_in_out: fuse_uring_ent_in_out,
    }

    /// Command in the SQE's 80-byte command area (REGISTER, COMMIT_AND_FETCH).
    pub struct fuse_uring_cmd_req {
        pub flags: u64,
        pub commit_id: u64,
        /// Queue index: one queue per possible CPU.
        pub qid: u16,
        pub padding: [u8; 6],
    }
}
