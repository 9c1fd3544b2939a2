//! The FUSE kernel ABI: `#[repr(C)]` structs and constants, no logic.
//!
//! Compatible with ABI 7.45, the minor of the current kernel header
//! (`include/uapi/linux/fuse.h`; 7.44 added `FUSE_NOTIFY_INC_EPOCH`, 7.45
//! `FUSE_COPY_FILE_RANGE_64`, neither of which changes a struct used here).
//! Kernels back to 7.9 are understood: older kernels send shorter versions of
//! a few structs, and the decoder ([`crate::decode`]) and INIT negotiation
//! ([`crate::init`]) deal with that, not this module.
//!
//! The structs live in three private modules, all re-exported here: one for
//! the header, INIT and the requests on a node's data and attributes, one for
//! those on names, listings, xattrs, locks and copy_file_range, one for FUSE
//! over io_uring.
//!
//! Every struct keeps its kernel name and field names so that the header can be
//! read side by side with this file. They derive zerocopy's `FromBytes`,
//! `IntoBytes`, `KnownLayout` and `Immutable`, so a request buffer can be viewed
//! as `&fuse_read_in` without `unsafe`, and a reply struct can be written as
//! bytes. Sizes are checked against the header's values in the tests below.
//!
//! Where Rust differs from C, the field says so: `char[]` becomes `[u8; N]`,
//! a flexible `char name[]` is left out of the struct (`fuse_dirent`), the
//! field `type` is spelled `r#type`, and the few signed fields (`fuse_out_header::error`, `fuse_open_out::backing_id`,
//! `fuse_sx_time::tv_sec`) stay signed.
#![allow(nonstandard_style)]

mod consts;
mod dirs;
mod structs;
mod uring;

pub use consts::*;
pub use dirs::*;
pub use structs::*;
pub use uring::*;

#[cfg(test)]
mod tests;
