//! Listing tests: golden bytes of READDIR and READDIRPLUS records, a full
//! buffer, and names the kernel would refuse.

use super::*;
use zerocopy::FromZeros;

/// "." and "file.txt", as the kernel's `fuse_parse_dirfile` reads them.
#[rustfmt::skip]
const TWO_DIRENTS: [u8; 64] = [
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // ino 1
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // off 1: the next READDIR resumes after "."
    0x01, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, // namelen 1, type DT_DIR
    b'.', 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // name ".", 7 bytes of padding
    0x34, 0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // ino 0x1234
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // off 2
    0x08, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, // namelen 8, type DT_REG
    b'f', b'i', b'l', b'e', b'.', b't', b'x', b't', // name "file.txt": 32 bytes, no padding
];

/// The `fuse_dirent` part of a READDIRPLUS record for a symlink "ln".
#[rustfmt::skip]
const SYMLINK_DIRENT: [u8; 32] = [
    0x99, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // ino 0x99, from entry_out.attr.ino
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // off 5
    0x02, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, // namelen 2, type DT_LNK (0o120777 >> 12)
    b'l', b'n', 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // name "ln", 6 bytes of padding
];

#[test]
fn readdir_records_golden() {
    let mut buf = [0xffu8; 4096]; // padding must be zeroed, not left as found
    let mut list = ReaddirBuf::new(&mut buf, 4096);
    assert!(list.is_empty());
    let dir = dirent_type(libc::S_IFDIR | 0o755);
    assert_eq!(list.push(1, 1, dir, b"."), Pushed::Added);
    let file = dirent_type(libc::S_IFREG | 0o644);
    assert_eq!(list.push(0x1234, 2, file, b"file.txt"), Pushed::Added);
    assert_eq!(list.len(), 64);
    let reply = list.reply(7);
    assert_eq!(reply.len(), 16 + 64);
    assert_eq!(&*reply.io_slices()[1], &TWO_DIRENTS[..]);
    assert_eq!(reply.io_slices()[1].as_ptr(), buf.as_ptr()); // in place, no copy
}

#[test]
fn readdirplus_record_golden() {
    let mut entry = fuse_entry_out::new_zeroed();
    (entry.nodeid, entry.entry_valid, entry.attr_valid) = (7, 1, 1);
    (entry.attr.ino, entry.attr.mode) = (0x99, libc::S_IFLNK | 0o777);
    let mut buf = [0xffu8; 4096];
    let mut list = ReaddirPlusBuf::new(&mut buf, 4096);
    assert_eq!(list.push(&entry, 5, b"ln"), Pushed::Added);
    assert_eq!(list.len(), 160);
    let reply = list.reply(8);
    let record = &*reply.io_slices()[1];
    assert_eq!(&record[..128], entry.as_bytes());
    assert_eq!(&record[128..], &SYMLINK_DIRENT[..]);
}

/// A record that does not fit the READDIR's size (or the buffer) is not
/// written; the caller resumes with it.
#[test]
fn full_listing_keeps_what_fit() {
    let mut buf = [0u8; 4096];
    let mut list = ReaddirBuf::new(&mut buf, 40);
    assert_eq!(list.push(1, 1, 4, b"."), Pushed::Added);
    assert_eq!(list.push(2, 2, 8, b"file.txt"), Pushed::Full);
    assert_eq!(list.push(3, 3, 8, b"a"), Pushed::Full); // 32 + 32 > 40
    assert_eq!(list.len(), 32);
    let mut small = [0u8; 31];
    let mut list = ReaddirBuf::new(&mut small, 4096);
    assert_eq!(list.push(1, 1, 4, b"."), Pushed::Full);
    assert!(list.is_empty());
    assert_eq!(list.reply(9).len(), 16); // an empty listing: end of directory
    let mut plus = [0u8; 159];
    let entry = fuse_entry_out::new_zeroed();
    let mut list = ReaddirPlusBuf::new(&mut plus, 4096);
    assert_eq!(list.push(&entry, 1, b"ln"), Pushed::Full);
}

/// Names the kernel refuses with EIO for the whole listing are refused here.
#[test]
fn bad_names_are_refused_and_leave_nothing() {
    let mut buf = [0u8; 4096];
    let mut list = ReaddirBuf::new(&mut buf, 4096);
    let long = [b'x'; FUSE_NAME_MAX + 1];
    for name in [&b""[..], b"a/b", b"a\0b", &long[..]] {
        assert_eq!(list.push(1, 1, 8, name), Pushed::BadName);
    }
    assert!(list.is_empty());
    assert_eq!(list.push(1, 1, 8, &long[1..]), Pushed::Added);
    assert_eq!(list.len(), FUSE_DIRENT_ALIGN(24 + FUSE_NAME_MAX));
    let entry = fuse_entry_out::new_zeroed();
    let mut list = ReaddirPlusBuf::new(&mut buf, 4096);
    assert_eq!(list.push(&entry, 1, b"a/b"), Pushed::BadName);
}
