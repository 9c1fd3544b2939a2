//! Directory listings: READDIR and READDIRPLUS replies packed into the
//! caller's buffer.
//!
//! # Contract
//!
//! - A reply is a run of records, each a `fuse_dirent` (READDIR) or a
//!   `fuse_direntplus` (READDIRPLUS) followed by `namelen` name bytes and zeros
//!   up to the next multiple of 8 (`FUSE_DIRENT_ALIGN`). The kernel stops at the
//!   first record that does not fit whole, so a record is written whole or not
//!   at all, and the listing never exceeds the READDIR's `size`.
//! - `off` of a record is a cookie: the kernel sends it back as the `offset`
//!   of the READDIR that continues after that record (and 0 starts a listing).
//!   When [`Pushed::Full`] comes back, the entry was not written: remember it
//!   (or its position) and offer it first to the next READDIR.
//! - An empty reply means the end of the directory.
//! - The kernel fails the whole READDIR with EIO on an empty name, a name with
//!   '/' or longer than [`FUSE_NAME_MAX`]; such a name (or one with a NUL) is
//!   refused here ([`Pushed::BadName`]) so that one bad entry cannot hide the
//!   rest of the directory.
//! - For READDIRPLUS, an entry with `nodeid` 0 carries only its name (no
//!   lookup reference is taken, so no FORGET follows); any other `nodeid`
//!   counts as a LOOKUP of that inode, like a LOOKUP reply.
//!
//! The buffer is bytes, copied into (no alignment needed): the transports hand
//! their page-aligned data buffer, and the listing goes out as
//! [`Reply::data`](super::Reply::data) without another copy.

use super::Reply;
use crate::abi::{fuse_dirent, fuse_direntplus, fuse_entry_out, FUSE_DIRENT_ALIGN, FUSE_NAME_MAX};
use core::marker::PhantomData;
use zerocopy::IntoBytes;

/// What became of one entry offered to a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Pushed {
    /// The record was written.
    Added,
    /// The record does not fit: stop, and start the next READDIR with this entry.
    Full,
    /// The name is empty, too long, or holds '/' or NUL: skip the entry.
    BadName,
}

/// Records packed into the front of a buffer.
struct Packer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Packer<'a> {
    fn new(buf: &'a mut [u8], size: u32) -> Self {
        let limit = buf.len().min(size as usize);
        Packer {
            buf: &mut buf[..limit],
            len: 0,
        }
    }

    /// Writes `fixed`, `name` and the padding after it, if the record fits.
    fn push(&mut self, fixed: &[u8], name: &[u8]) -> Pushed {
        let end = self.len + FUSE_DIRENT_ALIGN(fixed.len() + name.len());
        let Some(record) = self.buf.get_mut(self.len..end) else {
            return Pushed::Full;
        };
        let (head, rest) = record.split_at_mut(fixed.len());
        let (name_bytes, padding) = rest.split_at_mut(name.len());
        head.copy_from_slice(fixed);
        name_bytes.copy_from_slice(name);
        padding.fill(0);
        self.len = end;
        Pushed::Added
    }
}

/// `namelen` of a name the kernel accepts in a directory record.
fn name_len(name: &[u8]) -> Option<u32> {
    let valid = (1..=FUSE_NAME_MAX).contains(&name.len()) && !name.contains(&b'/');
    (valid && !name.contains(&0)).then_some(name.len() as u32)
}

/// `DT_*` of a mode: its file type bits, shifted (`(mode & S_IFMT) >> 12`).
pub const fn dirent_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

/// Marker of a READDIR listing ([`ReaddirBuf`]).
#[derive(Debug)]
pub enum Plain {}
/// Marker of a READDIRPLUS listing ([`ReaddirPlusBuf`]).
#[derive(Debug)]
pub enum Plus {}

/// A READDIR (`K` = [`Plain`]) or READDIRPLUS (`K` = [`Plus`]) reply being packed.
pub struct Listing<'a, K> {
    packer: Packer<'a>,
    kind: PhantomData<K>,
}

/// A READDIR reply being packed: `fuse_dirent` records.
pub type ReaddirBuf<'a> = Listing<'a, Plain>;
/// A READDIRPLUS reply being packed: `fuse_direntplus` records.
pub type ReaddirPlusBuf<'a> = Listing<'a, Plus>;

impl<'a, K> Listing<'a, K> {
    /// A listing in `buf`, at most `size` bytes (the request's `fuse_read_in::size`).
    pub fn new(buf: &'a mut [u8], size: u32) -> Self {
        Listing {
            packer: Packer::new(buf, size),
            kind: PhantomData,
        }
    }

    /// Bytes packed so far.
    pub fn len(&self) -> usize {
        self.packer.len
    }

    /// True before the first record (an empty reply ends the listing).
    pub fn is_empty(&self) -> bool {
        self.packer.len == 0
    }

    /// The reply to request `unique`: the records, as data.
    pub fn reply(self, unique: u64) -> Reply<'a> {
        let Packer { buf, len } = self.packer;
        Reply::data(unique, &buf[..len])
    }
}

impl Listing<'_, Plain> {
    /// Adds the entry `name` (without NUL) of inode `ino` and type `DT_*`
    /// (see [`dirent_type`]); `off` is the cookie of the entry after it.
    pub fn push(&mut self, ino: u64, off: u64, r#type: u32, name: &[u8]) -> Pushed {
        let Some(namelen) = name_len(name) else {
            return Pushed::BadName;
        };
        let record = fuse_dirent {
            ino,
            off,
            namelen,
            r#type,
        };
        self.packer.push(record.as_bytes(), name)
    }
}

impl Listing<'_, Plus> {
    /// Adds the entry `name` (without NUL) with its LOOKUP answer `entry`; the
    /// record's ino and type come from `entry.attr`, `off` is the cookie of
    /// the entry after it. See the module contract for `nodeid` 0.
    pub fn push(&mut self, entry: &fuse_entry_out, off: u64, name: &[u8]) -> Pushed {
        let Some(namelen) = name_len(name) else {
            return Pushed::BadName;
        };
        let dirent = fuse_dirent {
            ino: entry.attr.ino,
            off,
            namelen,
            r#type: dirent_type(entry.attr.mode),
        };
        let record = fuse_direntplus {
            entry_out: *entry,
            dirent,
        };
        self.packer.push(record.as_bytes(), name)
    }
}

#[cfg(test)]
#[path = "dirents_tests.rs"]
mod tests;
