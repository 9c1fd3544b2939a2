//! Decoder tests: golden bytes, short reads for every opcode, and a randomized
//! no-panic run over random, truncated and mutated buffers.

use super::*;
use crate::request::{Operation, Request};
use zerocopy::IntoBytes;

/// An 8-byte aligned copy of `bytes`, as the server's buffers are.
pub(super) struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    pub(super) fn new(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8) + 1];
        words.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
        Aligned {
            words,
            len: bytes.len(),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.words.as_bytes()[..self.len]
    }
}

/// A request with a correct header around `args`.
pub(super) fn request(opcode: u32, unique: u64, args: &[u8]) -> Vec<u8> {
    let header = fuse_in_header {
        len: (40 + args.len()) as u32,
        opcode,
        unique,
        nodeid: FUSE_ROOT_ID,
        uid: 1000,
        gid: 100,
        pid: 4242,
        total_extlen: 0,
        padding: 0,
    };
    [header.as_bytes(), args].concat()
}

/// INIT from a 7.45 kernel (Linux 6.18), captured from /dev/fuse on x86_64.
#[rustfmt::skip]
const INIT_REQUEST: [u8; 104] = [
    0x68, 0x00, 0x00, 0x00, 0x1a, 0x00, 0x00, 0x00, // len 104, opcode 26 (INIT)
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unique 2
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // nodeid 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // uid 0, gid 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // pid 0, total_extlen 0, padding 0
    0x07, 0x00, 0x00, 0x00, 0x2d, 0x00, 0x00, 0x00, // major 7, minor 45
    0x00, 0x00, 0x02, 0x00, 0xfb, 0xff, 0xff, 0x73, // max_readahead 128 KiB, flags 0x73fffffb
    0xfd, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags2 0x5fd, unused[0]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unused[1..3]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unused[3..5]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unused[5..7]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unused[7..9]
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unused[9..11]
];

/// READ of 4 KiB at offset 4096.
#[rustfmt::skip]
const READ_REQUEST: [u8; 80] = [
    0x50, 0x00, 0x00, 0x00, 0x0f, 0x00, 0x00, 0x00, // len 80, opcode 15 (READ)
    0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unique 42
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // nodeid 1 (root)
    0xe8, 0x03, 0x00, 0x00, 0x64, 0x00, 0x00, 0x00, // uid 1000, gid 100
    0x92, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // pid 4242, total_extlen 0, padding 0
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // fh 7
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset 4096
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // size 4096, read_flags 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // lock_owner 0
    0x02, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags O_RDWR|O_LARGEFILE, padding 0
];

/// WRITE of 12 bytes at offset 512: 8 in the head, 4 spilled into the tail.
#[rustfmt::skip]
const WRITE_HEAD: [u8; 88] = [
    0x5c, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, // len 92, opcode 16 (WRITE)
    0x2c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // unique 44
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // nodeid 1 (root)
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // uid 0, gid 0
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // pid 1, total_extlen 0, padding 0
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // fh 7
    0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // offset 512
    0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // size 12, write_flags 0
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // lock_owner 0
    0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // flags O_RDWR, padding 0
    b'h', b'e', b'l', b'l', b'o', b',', b' ', b'w', // data[0..8], in place
];
/// The rest of the WRITE payload, in the spill-over buffer.
const WRITE_TAIL: [u8; 4] = *b"orld";

#[test]
fn golden_init() {
    let buf = Aligned::new(&INIT_REQUEST);
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert_eq!((req.unique, req.opcode, req.len), (2, FUSE_INIT, 104));
    let Operation::Init { arg } = req.op else {
        panic!("not INIT: {req}")
    };
    assert_eq!(
        (arg.major, arg.minor, arg.max_readahead),
        (7, 45, 128 * 1024)
    );
    assert_eq!((arg.flags, arg.flags2), (0x73ff_fffb, 0x5fd));
    assert_eq!(
        req.to_string(),
        "FUSE(   2) INIT kernel 7.45 max_readahead=131072 flags=0x73fffffb flags2=0x5fd"
    );
}

#[test]
fn golden_init_before_7_36_has_no_flags2() {
    let mut old = INIT_REQUEST[..56].to_vec(); // header + 16-byte fuse_init_in
    old[0] = 56;
    old[44] = 35; // minor 35
    let buf = Aligned::new(&old);
    let Operation::Init { arg } = Request::decode(buf.bytes(), &[]).unwrap().op else {
        panic!()
    };
    assert_eq!((arg.minor, arg.flags, arg.flags2), (35, 0x73ff_fffb, 0));
}

#[test]
fn golden_read() {
    let buf = Aligned::new(&READ_REQUEST);
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert_eq!(
        (req.uid, req.gid, req.pid, req.nodeid),
        (1000, 100, 4242, 1)
    );
    let Operation::Read { arg } = req.op else {
        panic!("not READ: {req}")
    };
    assert_eq!(
        (arg.fh, arg.offset, arg.size, arg.flags),
        (7, 4096, 4096, 0x8002)
    );
    assert_eq!(req.to_string(), "FUSE(  42) READ fh=7 off=4096 len=4096");
}

#[test]
fn golden_write_split_across_head_and_tail() {
    let buf = Aligned::new(&WRITE_HEAD);
    let req = Request::decode(buf.bytes(), &WRITE_TAIL).unwrap();
    let Operation::Write { arg, data } = req.op else {
        panic!("not WRITE: {req}")
    };
    assert_eq!((arg.offset, arg.size, data.len()), (512, 12, 12));
    assert_eq!(data.parts(), (&b"hello, w"[..], &b"orld"[..]));
    let [a, b] = data.io_slices();
    assert_eq!([&*a, &*b].concat(), b"hello, world");
    let mut out = [0u8; 12];
    assert_eq!(data.copy_to(&mut out), 12);
    assert_eq!(&out, b"hello, world");
    assert!(req
        .to_string()
        .ends_with("WRITE fh=7 off=512 len=12 (in place 8 + spilled 4)"));
}

#[test]
fn write_size_must_match_payload() {
    let buf = Aligned::new(&WRITE_HEAD);
    let err = Request::decode(buf.bytes(), b"orl").unwrap_err();
    assert_eq!(
        err,
        DecodeError::LengthMismatch {
            header: 92,
            got: 91
        }
    );
    let mut head = WRITE_HEAD;
    head[0] = 91;
    let buf = Aligned::new(&head);
    let err = Request::decode(buf.bytes(), b"orl").unwrap_err();
    assert_eq!(err, DecodeError::WriteSizeMismatch { size: 12, got: 11 });
}

#[test]
fn only_write_may_spill_into_the_tail() {
    let buf = Aligned::new(&READ_REQUEST[..72]);
    let mut head = buf.bytes().to_vec();
    head[0] = 80; // the last 8 bytes of fuse_read_in arrive in the tail
    let buf = Aligned::new(&head);
    let err = Request::decode(buf.bytes(), &READ_REQUEST[72..]).unwrap_err();
    assert!(matches!(err, DecodeError::ShortRead { .. }), "{err}");
}

#[test]
fn lookup_batch_forget_and_unknown() {
    let buf = Aligned::new(&request(FUSE_LOOKUP, 6, b"disk.img\0"));
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert!(matches!(req.op, Operation::Lookup { name } if name == c"disk.img"));
    let nodes = [
        fuse_forget_one {
            nodeid: 2,
            nlookup: 1,
        },
        fuse_forget_one {
            nodeid: 3,
            nlookup: 5,
        },
    ];
    let arg = fuse_batch_forget_in { count: 2, dummy: 0 };
    let buf = Aligned::new(&request(
        FUSE_BATCH_FORGET,
        8,
        &[arg.as_bytes(), nodes.as_bytes()].concat(),
    ));
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert!(matches!(req.op, Operation::BatchForget { nodes: n, .. } if n == nodes));
    assert!(!req.expects_reply());
    let buf = Aligned::new(&request(FUSE_IOCTL, 10, &[0; 16]));
    let req = Request::decode(buf.bytes(), &[]).unwrap();
    assert!(matches!(req.op, Operation::Unknown { opcode: FUSE_IOCTL }));
    assert_eq!(req.to_string(), "FUSE(  10) IOCTL (unsupported)");
}

#[test]
fn lookup_without_nul_and_bad_length() {
    let buf = Aligned::new(&request(FUSE_LOOKUP, 6, b"disk.img"));
    assert_eq!(
        Request::decode(buf.bytes(), &[]).unwrap_err(),
        DecodeError::MissingNul
    );
    let buf = Aligned::new(&READ_REQUEST);
    let err = Request::decode(&buf.bytes()[..79], &[]).unwrap_err();
    assert_eq!(
        err,
        DecodeError::LengthMismatch {
            header: 80,
            got: 79
        }
    );
}

#[test]
fn unaligned_head_is_an_error() {
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&READ_REQUEST);
    let buf = Aligned::new(&bytes);
    assert_eq!(
        Request::decode(&buf.bytes()[1..], &[]).unwrap_err(),
        DecodeError::Unaligned
    );
}

#[test]
fn extensions_are_stripped_from_the_end() {
    let mut bytes = request(FUSE_GETATTR, 12, &[0; 16 + 8]);
    bytes[36] = 1; // total_extlen: one 8-byte unit
    let buf = Aligned::new(&bytes);
    assert!(matches!(
        Request::decode(buf.bytes(), &[]).unwrap().op,
        Operation::Getattr { .. }
    ));
    bytes[36] = 9; // more extension than request
    let buf = Aligned::new(&bytes);
    assert!(matches!(
        Request::decode(buf.bytes(), &[]),
        Err(DecodeError::ShortRead { .. })
    ));
}

/// Opcodes with fixed arguments and the size of those arguments.
pub(super) const FIXED_ARGS: [(u32, usize); 15] = [
    (FUSE_INIT, 8), // the minimum: major and minor
    (FUSE_GETATTR, 16),
    (FUSE_SETATTR, 88),
    (FUSE_OPEN, 8),
    (FUSE_RELEASE, 24),
    (FUSE_FLUSH, 24),
    (FUSE_FSYNC, 16),
    (FUSE_READ, 40),
    (FUSE_WRITE, 40),
    (FUSE_FALLOCATE, 32),
    (FUSE_LSEEK, 24),
    (FUSE_INTERRUPT, 8),
    (FUSE_STATX, 24),
    (FUSE_FORGET, 8),
    (FUSE_BATCH_FORGET, 8),
];

/// Every prefix shorter than header + arguments is a ShortRead, even when
/// the header's `len` agrees with it.
#[test]
fn short_reads_for_every_opcode() {
    let dir_fixed = DIR_REQUEST_LAYOUTS.iter().filter(|l| l.1 > 0 && l.2 == 0);
    let all = FIXED_ARGS.into_iter().chain(dir_fixed.map(|l| (l.0, l.1)));
    for (opcode, size) in all {
        let full = request(opcode, 2, &vec![0; size]);
        assert!(
            Request::decode(Aligned::new(&full).bytes(), &[]).is_ok(),
            "opcode {opcode}"
        );
        for cut in 0..full.len() {
            let mut short = full[..cut].to_vec();
            if cut >= 4 {
                short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
            }
            let err = Request::decode(Aligned::new(&short).bytes(), &[]).unwrap_err();
            assert!(
                matches!(err, DecodeError::ShortRead { .. }),
                "opcode {opcode} cut {cut}: {err}"
            );
        }
    }
}

/// Requests without arguments decode from a bare header; a truncated header
/// is a short read for them too.
#[test]
fn argumentless_opcodes() {
    for opcode in [FUSE_STATFS, FUSE_DESTROY, FUSE_READLINK, 9999] {
        let full = request(opcode, 4, &[]);
        assert!(Request::decode(Aligned::new(&full).bytes(), &[]).is_ok());
        let err = Request::decode(Aligned::new(&full[..39]).bytes(), &[]).unwrap_err();
        assert_eq!(err, DecodeError::ShortRead { need: 40, got: 39 });
    }
}
