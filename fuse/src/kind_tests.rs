//! The classification against the decoder: every opcode decodes to an operation of the
//! kind its opcode names, and every kind's opcode decodes.

use super::*;
use crate::request::Request;
use zerocopy::IntoBytes;

/// A request of `opcode` with `body` after a correct header, decoded (the buffer 8-byte
/// aligned, as the server's are); `None` if it does not decode.
fn decoded_kind(opcode: u32, body: &[u8]) -> Option<OpKind> {
    let header = fuse_in_header {
        len: (40 + body.len()) as u32,
        opcode,
        unique: 2,
        nodeid: FUSE_ROOT_ID,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    let bytes = [header.as_bytes(), body].concat();
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    words.as_mut_bytes()[..bytes.len()].copy_from_slice(&bytes);
    let head = &words.as_bytes()[..bytes.len()];
    Request::decode(head, &[]).ok().map(|req| req.op.kind())
}

/// The kind `opcode` decodes to, from the first body that decodes: a zeroed argument
/// struct of 0 to 128 bytes followed by none, one or two names. Sizes in the zeroed
/// structs (WRITE's, SETXATTR's, BATCH_FORGET's count) are 0, so no payload follows.
fn kind_of_opcode(opcode: u32) -> Option<OpKind> {
    (0..=128).step_by(8).find_map(|len| {
        (0..=2).find_map(|names| {
            let mut body = vec![0u8; len];
            body.extend(b"a\0".repeat(names));
            decoded_kind(opcode, &body)
        })
    })
}

#[test]
fn every_opcode_decodes_to_the_kind_of_its_opcode() {
    for opcode in 0..=255 {
        let kind = OpKind::from_opcode(opcode);
        assert_eq!(kind_of_opcode(opcode), Some(kind), "opcode {opcode}");
    }
    assert_eq!(kind_of_opcode(u32::MAX), Some(OpKind::Unknown));
}

#[test]
fn every_known_kind_has_its_own_opcode() {
    for (i, kind) in OpKind::KNOWN.iter().enumerate() {
        let opcode = kind.opcode().expect("a known kind has an opcode");
        assert_eq!(OpKind::from_opcode(opcode), *kind);
        assert!(
            OpKind::KNOWN[..i].iter().all(|k| k != kind),
            "{kind:?} twice"
        );
        assert_ne!(kind.name(), "UNKNOWN");
    }
    assert_eq!(OpKind::Unknown.opcode(), None);
    assert_eq!(OpKind::from_opcode(FUSE_IOCTL), OpKind::Unknown);
    assert_eq!(OpKind::KNOWN.len(), 46);
}

#[test]
fn names_are_the_kernels_without_prefix() {
    assert_eq!(OpKind::Read.name(), "READ");
    assert_eq!(OpKind::CopyFileRange64.name(), "COPY_FILE_RANGE_64");
    assert_eq!(OpKind::BatchForget.name(), "BATCH_FORGET");
    for kind in OpKind::KNOWN {
        let opcode = kind.opcode().unwrap();
        assert_eq!(Some(kind.name()), crate::display::opcode_name(opcode));
    }
}

/// The names of the known kinds that have `property`, in opcode order.
fn names_where(property: impl Fn(OpKind) -> bool) -> Vec<&'static str> {
    let known = OpKind::KNOWN.iter().copied();
    known.filter(|k| property(*k)).map(OpKind::name).collect()
}

#[test]
fn only_the_forgets_and_interrupt_take_no_reply() {
    let silent = names_where(|k| !k.replies());
    assert_eq!(silent, ["FORGET", "INTERRUPT", "BATCH_FORGET"]);
    assert!(OpKind::Unknown.replies(), "answered ENOSYS");
}

#[test]
fn replies_of_unknown_length_need_the_data_buffer() {
    let data = names_where(OpKind::needs_data_buffer);
    let want = [
        "READLINK",
        "READ",
        "GETXATTR",
        "LISTXATTR",
        "READDIR",
        "READDIRPLUS",
    ];
    assert_eq!(data, want);
}

#[test]
fn node_making_and_attribute_changes_run_as_the_caller() {
    assert_eq!(
        names_where(OpKind::changes_as_caller),
        [
            "SETATTR",
            "SYMLINK",
            "MKNOD",
            "MKDIR",
            "RENAME",
            "LINK",
            "SETXATTR",
            "REMOVEXATTR",
            "CREATE",
            "RENAME2",
            "TMPFILE"
        ]
    );
}

#[test]
fn families_group_the_kinds() {
    assert_eq!(OpKind::Read.family(), Family::Data);
    assert_eq!(OpKind::Fsyncdir.family(), Family::Sync);
    assert_eq!(OpKind::Readdirplus.family(), Family::Listing);
    assert_eq!(OpKind::Forget.family(), Family::Session);
    assert_eq!(OpKind::Unknown.family(), Family::Other);
}
