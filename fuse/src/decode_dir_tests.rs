//! Decoder tests for the operations on names, listings, xattrs and locks: golden argument
//! bytes (the header around them is the one `golden_read` checks), and the
//! rejection of every malformed name, table-driven over the named opcodes.

use super::tests::{request, Aligned};
use super::*;
use crate::request::{Operation, Request};
use zerocopy::IntoBytes;

/// Decodes `bytes` (one buffer, no tail) and hands the request to `check`.
fn with_decoded(bytes: &[u8], features: Features, check: impl FnOnce(Request<'_>)) {
    let buf = Aligned::new(bytes);
    match Request::decode_with(buf.bytes(), &[], features) {
        Ok(req) => check(req),
        Err(e) => panic!("{e}"),
    }
}

/// The error of decoding `bytes`, split into head and tail at `split`.
fn error_of(bytes: &[u8], split: usize) -> DecodeError {
    let buf = Aligned::new(bytes);
    let (head, tail) = buf.bytes().split_at(split);
    match Request::decode(head, tail) {
        Ok(req) => panic!("decoded {req}"),
        Err(e) => e,
    }
}

/// LOOKUP of "foo".
const LOOKUP_ARGS: [u8; 4] = *b"foo\0";

/// MKDIR "d" with mode 0755, umask 022.
#[rustfmt::skip]
const MKDIR_ARGS: [u8; 10] = [
    0xed, 0x01, 0x00, 0x00, 0x12, 0x00, 0x00, 0x00, // mode 0o755, umask 0o022
    b'd', 0x00,                                     // name "d"
];

/// RENAME2 of "a" to "b" in directory 5, RENAME_NOREPLACE.
#[rustfmt::skip]
const RENAME2_ARGS: [u8; 20] = [
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // newdir 5
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags RENAME_NOREPLACE, padding
    b'a', 0x00, b'b', 0x00,                         // old name "a", new name "b"
];

/// SYMLINK "ln" -> "../t": the entry's name comes first, then the target.
const SYMLINK_ARGS: [u8; 8] = *b"ln\0../t\0";

/// SETXATTR "user.a" = "xyz", XATTR_CREATE, without FUSE_SETXATTR_EXT.
#[rustfmt::skip]
const SETXATTR_ARGS: [u8; 18] = [
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // size 3, flags XATTR_CREATE
    b'u', b's', b'e', b'r', b'.', b'a', 0x00,       // name "user.a"
    b'x', b'y', b'z',                               // value, no NUL
];

/// The same with FUSE_SETXATTR_EXT: 8 more bytes before the name.
#[rustfmt::skip]
const SETXATTR_EXT_ARGS: [u8; 26] = [
    0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // size 3, flags XATTR_CREATE
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // setxattr_flags ACL_KILL_SGID, padding
    b'u', b's', b'e', b'r', b'.', b'a', 0x00,       // name "user.a"
    b'x', b'y', b'z',                               // value, no NUL
];

/// CREATE "f", O_WRONLY|O_CREAT|O_TRUNC|O_LARGEFILE, mode 0100644, umask 022.
#[rustfmt::skip]
const CREATE_ARGS: [u8; 18] = [
    0x41, 0x82, 0x00, 0x00, 0xa4, 0x81, 0x00, 0x00, // flags 0x8241, mode 0o100644
    0x12, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // umask 0o022, open_flags 0
    b'f', 0x00,                                     // name "f"
];

/// READDIRPLUS of 4 KiB from cookie 2 on directory handle 3.
#[rustfmt::skip]
const READDIRPLUS_ARGS: [u8; 40] = [
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // fh 3
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset: cookie 2
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // size 4096, read_flags 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // lock_owner 0
    0x00, 0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // flags O_DIRECTORY|O_LARGEFILE
];

/// BATCH_FORGET of two nodes.
#[rustfmt::skip]
const BATCH_FORGET_ARGS: [u8; 40] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // count 2, dummy
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // [0].nodeid 2
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // [0].nlookup 1
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // [1].nodeid 3
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // [1].nlookup 5
];

#[test]
fn golden_lookup_mkdir_symlink() {
    with_decoded(
        &request(FUSE_LOOKUP, 20, &LOOKUP_ARGS),
        Features::default(),
        |req| {
            let Operation::Lookup { name } = req.op else {
                panic!("{req}")
            };
            assert_eq!(name.to_bytes_with_nul(), b"foo\0");
            assert_eq!(req.to_string(), r#"FUSE(  20) LOOKUP "foo""#);
        },
    );
    with_decoded(
        &request(FUSE_MKDIR, 21, &MKDIR_ARGS),
        Features::default(),
        |req| {
            let Operation::Mkdir { arg, name } = req.op else {
                panic!("{req}")
            };
            assert_eq!((arg.mode, arg.umask, name), (0o755, 0o22, c"d"));
            assert_eq!(
                req.to_string(),
                r#"FUSE(  21) MKDIR "d" mode=0o755 umask=0o22"#
            );
        },
    );
    with_decoded(
        &request(FUSE_SYMLINK, 22, &SYMLINK_ARGS),
        Features::default(),
        |req| {
            let Operation::Symlink { name, target } = req.op else {
                panic!("{req}")
            };
            assert_eq!((name, target), (c"ln", c"../t"));
            assert_eq!(req.to_string(), r#"FUSE(  22) SYMLINK "ln" -> "../t""#);
        },
    );
}

#[test]
fn golden_rename2_create_readdirplus() {
    with_decoded(
        &request(FUSE_RENAME2, 23, &RENAME2_ARGS),
        Features::default(),
        |req| {
            let Operation::Rename2 { arg, name, newname } = req.op else {
                panic!("{req}")
            };
            assert_eq!((arg.newdir, arg.flags), (5, RENAME_NOREPLACE));
            assert_eq!((name, newname), (c"a", c"b"));
            assert!(req
                .to_string()
                .ends_with(r#"RENAME2 "a" -> dir=5 "b" flags=0x1"#));
        },
    );
    with_decoded(
        &request(FUSE_CREATE, 24, &CREATE_ARGS),
        Features::default(),
        |req| {
            let Operation::Create { arg, name } = req.op else {
                panic!("{req}")
            };
            assert_eq!(
                (arg.flags, arg.mode, arg.umask, name),
                (0x8241, 0o100644, 0o22, c"f")
            );
        },
    );
    with_decoded(
        &request(FUSE_READDIRPLUS, 25, &READDIRPLUS_ARGS),
        Features::default(),
        |req| {
            let Operation::Readdirplus { arg } = req.op else {
                panic!("{req}")
            };
            assert_eq!(
                (arg.fh, arg.offset, arg.size, arg.flags),
                (3, 2, 4096, 0x18000)
            );
            assert!(req.to_string().ends_with("READDIRPLUS fh=3 off=2 len=4096"));
        },
    );
    with_decoded(
        &request(FUSE_BATCH_FORGET, 26, &BATCH_FORGET_ARGS),
        Features::default(),
        |req| {
            let Operation::BatchForget { arg, nodes } = req.op else {
                panic!("{req}")
            };
            assert_eq!(arg.count, 2);
            assert_eq!(nodes.as_bytes(), &BATCH_FORGET_ARGS[8..]);
            assert_eq!((nodes[1].nodeid, nodes[1].nlookup), (3, 5));
        },
    );
}

/// The SETXATTR struct's size comes from the session, not from the request.
#[test]
fn golden_setxattr_with_and_without_ext() {
    let ext = Features::from_flags(FUSE_SETXATTR_EXT | FUSE_INIT_EXT);
    assert!(ext.setxattr_ext && !Features::from_flags(FUSE_INIT_EXT).setxattr_ext);
    for (args, features, setxattr_flags) in [
        (&SETXATTR_ARGS[..], Features::default(), 0),
        (&SETXATTR_EXT_ARGS[..], ext, FUSE_SETXATTR_ACL_KILL_SGID),
    ] {
        with_decoded(&request(FUSE_SETXATTR, 27, args), features, |req| {
            let Operation::Setxattr { arg, name, value } = req.op else {
                panic!("{req}")
            };
            assert_eq!(
                (arg.size, arg.flags, arg.setxattr_flags),
                (3, 1, setxattr_flags)
            );
            assert_eq!((name, value.parts()), (c"user.a", (&b"xyz"[..], &[][..])));
        });
    }
    // The extended layout read as the old one: the value does not add up.
    let bytes = request(FUSE_SETXATTR, 28, &SETXATTR_EXT_ARGS);
    let err = error_of(&bytes, bytes.len());
    assert_eq!(err, DecodeError::WriteSizeMismatch { size: 3, got: 16 });
}

/// A SETXATTR value, like a WRITE payload, may continue in the tail; its
/// name may not.
#[test]
fn setxattr_value_may_spill_into_the_tail() {
    let bytes = request(FUSE_SETXATTR, 29, &SETXATTR_ARGS);
    let buf = Aligned::new(&bytes);
    let (head, tail) = buf.bytes().split_at(bytes.len() - 2);
    let req = Request::decode(head, tail).unwrap();
    let Operation::Setxattr { value, .. } = req.op else {
        panic!("{req}")
    };
    assert_eq!(value.parts(), (&b"x"[..], &b"yz"[..]));
    let in_name = 40 + 8 + 3;
    assert!(matches!(
        error_of(&bytes, in_name),
        DecodeError::ShortRead { .. }
    ));
    let mut short = SETXATTR_ARGS;
    short[0] = 4; // size 4, 3 bytes of value
    let bytes = request(FUSE_SETXATTR, 30, &short);
    let err = error_of(&bytes, bytes.len());
    assert_eq!(err, DecodeError::WriteSizeMismatch { size: 4, got: 3 });
}

/// Opcodes whose arguments end in names: the struct before them, how many names
/// (SETXATTR with a value of size 0).
fn named_layouts() -> impl Iterator<Item = (u32, usize, usize)> {
    DIR_REQUEST_LAYOUTS.into_iter().filter(|l| l.2 > 0)
}

/// The arguments of a named opcode: zeroed struct, then `names`.
pub(super) fn named_args(fixed: usize, names: &[&[u8]]) -> Vec<u8> {
    let mut args = vec![0; fixed];
    names.iter().for_each(|n| args.extend_from_slice(n));
    args
}

/// Names that stand in for real ones.
const NAMES: [&[u8]; 2] = [b"a\0", b"bc\0"];

/// A request that decodes, with `count` of [`NAMES`].
fn valid(opcode: u32, fixed: usize, count: usize) -> Vec<u8> {
    let bytes = request(opcode, 2, &named_args(fixed, &NAMES[..count]));
    let buf = Aligned::new(&bytes);
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert!(!matches!(req.op, Operation::Unknown { .. }), "{req}");
    assert!(req.to_string().contains(r#""a""#), "{req}");
    bytes
}

/// Every cut is a ShortRead inside the struct, a MissingNul after it.
#[test]
fn named_requests_cut_anywhere_are_rejected() {
    for (opcode, fixed, count) in named_layouts() {
        let full = valid(opcode, fixed, count);
        for cut in 40..full.len() {
            let mut short = full[..cut].to_vec();
            short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
            let err = error_of(&short, cut);
            match cut < 40 + fixed {
                true => assert!(
                    matches!(err, DecodeError::ShortRead { .. }),
                    "{opcode} {cut}"
                ),
                false => assert_eq!(err, DecodeError::MissingNul, "opcode {opcode} cut {cut}"),
            }
        }
    }
}

/// Missing NULs, empty names, bytes after the last name and names continued
/// in the tail are all rejected.
#[test]
fn named_requests_with_bad_names_are_rejected() {
    for (opcode, fixed, count) in named_layouts() {
        let names = &NAMES[..count];
        let mut no_nul = named_args(fixed, names);
        *no_nul.last_mut().unwrap() = b'x';
        let bytes = request(opcode, 3, &no_nul);
        assert_eq!(error_of(&bytes, bytes.len()), DecodeError::MissingNul);
        for empty in 0..count {
            let mut with_empty = names.to_vec();
            with_empty[empty] = b"\0";
            let bytes = request(opcode, 4, &named_args(fixed, &with_empty));
            assert_eq!(error_of(&bytes, bytes.len()), DecodeError::EmptyName);
        }
        let full = valid(opcode, fixed, count);
        let err = error_of(&full, full.len() - 1);
        assert!(
            matches!(err, DecodeError::ShortRead { .. }),
            "{opcode}: {err}"
        );
        let bytes = request(opcode, 5, &[&named_args(fixed, names)[..], b"z\0"].concat());
        let err = error_of(&bytes, bytes.len());
        match opcode {
            FUSE_SETXATTR => assert_eq!(err, DecodeError::WriteSizeMismatch { size: 0, got: 2 }),
            _ => assert_eq!(
                err,
                DecodeError::TrailingBytes { extra: 2 },
                "opcode {opcode}"
            ),
        }
    }
}

#[test]
fn fixed_directory_ops_and_their_log_lines() {
    let lk = fuse_lk_in {
        fh: 9,
        owner: 0xab,
        lk: fuse_file_lock {
            start: 0,
            end: 99,
            r#type: 1,
            pid: 7,
        },
        lk_flags: FUSE_LK_FLOCK,
        padding: 0,
    };
    with_decoded(
        &request(FUSE_SETLKW, 31, lk.as_bytes()),
        Features::default(),
        |req| {
            let Operation::Setlkw { arg } = req.op else {
                panic!("{req}")
            };
            assert_eq!(*arg, lk);
            assert!(req
                .to_string()
                .ends_with("SETLKW fh=9 owner=0xab type=1 range=0..=99 flags=0x1"));
        },
    );
    let link = fuse_link_in { oldnodeid: 12 };
    let bytes = request(FUSE_LINK, 32, &[link.as_bytes(), b"new\0"].concat());
    with_decoded(&bytes, Features::default(), |req| {
        assert!(
            req.to_string().ends_with(r#"LINK node 12 as "new""#),
            "{req}"
        );
    });
    with_decoded(
        &request(FUSE_READLINK, 33, &[]),
        Features::default(),
        |req| {
            assert_eq!(req.to_string(), "FUSE(  33) READLINK");
        },
    );
}

/// The longest SYMLINK the kernel sends fits in [`crate::init::LARGEST_HEAD_ONLY_REQUEST`].
#[test]
fn longest_symlink_decodes_in_the_largest_head() {
    let name = [b'n'; FUSE_NAME_MAX];
    let target = [b't'; libc::PATH_MAX as usize - 1];
    let args = [&name[..], b"\0", &target[..], b"\0"].concat();
    let bytes = request(FUSE_SYMLINK, 34, &args);
    assert_eq!(bytes.len(), crate::init::LARGEST_HEAD_ONLY_REQUEST);
    with_decoded(&bytes, Features::default(), |req| {
        let Operation::Symlink { name, target } = req.op else {
            panic!("{req}")
        };
        assert_eq!((name.count_bytes(), target.count_bytes()), (1024, 4095));
    });
}
