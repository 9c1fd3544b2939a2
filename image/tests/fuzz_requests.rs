//! Hostile requests, property-based: generated and mutated FUSE requests go through the
//! same entry point the daemon uses for every request (`transport::dispatch::serve_request`:
//! decode, run against the export, reply), against a file image, a read-only null export
//! and a growable null export.
//!
//! Properties, for every request: no panic; at most one reply, and exactly one when the
//! request decodes and its opcode takes a reply, or when it is malformed but its header is
//! readable (an EIO, so the kernel's caller does not hang); every reply's header is
//! consistent (its length is the bytes sent, its error 0 or an errno, an error reply has no
//! payload, the `unique` echoes the request's); a READ never returns more than it asked
//! for; and after each request the export still serves (GETATTR and a READ succeed).
//!
//! Why proptest: it runs on the stable toolchain, shrinks a failure to a small request,
//! and the same strategies serve both the short run inside `cargo test` (256 cases per
//! property, proptest's default) and the long documented run outside CI:
//! `PROPTEST_CASES=1000000 cargo test --release -p corofuse-image --test fuzz_requests`
//! (BENCHMARKS.md and README.md give the figures of the last one).

use std::io::{self, Write};
use std::sync::Arc;

use backend::{BlockBackend, Ctx, OpenOptions};
use fuse::abi::*;
use fuse::decode::{header_of, DIR_REQUEST_LAYOUTS};
use fuse::request::expects_reply;
use fuse::{Operation, Reply, Request};
use image_export::{Export, ExportOptions};
use proptest::prelude::*;
use transport::dispatch::serve_request;
use zerocopy::{FromZeros, IntoBytes};

/// The image's size: small enough to create per run, large enough for real offsets.
const IMAGE: u64 = 1 << 20;
/// What the transports hand READ: a 1 MiB reply buffer (the negotiated max_read).
const DATA: usize = 1 << 20;

/// Offsets and lengths worth trying: the edges of the image, of the types, and a few
/// random ones.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(IMAGE - 1),
        Just(IMAGE),
        Just(IMAGE + 1),
        Just(IMAGE - 4096),
        Just(i64::MAX as u64),
        Just(i64::MAX as u64 + 1),
        Just(u64::MAX),
        Just(u64::MAX - 4095),
        0..2 * IMAGE,
        (0..IMAGE / 4096).prop_map(|b| b * 4096),
        any::<u64>(),
    ]
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(512),
        Just(4096),
        Just(DATA as u32),
        Just(DATA as u32 + 1),
        Just(u32::MAX),
        0..70_000u32,
        any::<u32>(),
    ]
}

/// The opcodes the export handles, most of the time; any number otherwise.
fn opcode() -> impl Strategy<Value = u32> {
    prop_oneof![
        8 => prop::sample::select(vec![
            FUSE_GETATTR, FUSE_SETATTR, FUSE_OPEN, FUSE_RELEASE, FUSE_FLUSH, FUSE_FSYNC,
            FUSE_READ, FUSE_WRITE, FUSE_FALLOCATE, FUSE_LSEEK, FUSE_STATFS, FUSE_LOOKUP,
            FUSE_STATX, FUSE_INIT, FUSE_INTERRUPT, FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_DESTROY,
        ]),
        // A directory export's requests: the file export answers ENOSYS (or ENOENT).
        2 => prop::sample::select(DIR_REQUEST_LAYOUTS.iter().map(|op| op.0).collect::<Vec<_>>()),
        1 => 0..64u32,
        1 => any::<u32>(),
    ]
}

/// A directory export's request: its struct (from `c.offset` and `c.size`), then up to
/// two names cut from `c.extra` (no NUL inside, each NUL-terminated).
fn dir_args(c: &Case, fixed: usize, names: usize) -> Vec<u8> {
    let mut bytes = [c.offset.to_le_bytes(), u64::from(c.size).to_le_bytes()].concat();
    bytes.resize(fixed, 0);
    let name: Vec<u8> = c.extra.iter().map(|b| b.max(&1)).copied().collect();
    let (first, second) = name.split_at(name.len() / 2);
    for part in [first, second].into_iter().take(names) {
        bytes.extend_from_slice(part);
        bytes.push(0);
    }
    bytes
}

/// How a well-formed request is then damaged.
#[derive(Clone, Debug)]
enum Damage {
    None,
    /// `fuse_in_header::len` off by this much.
    HeaderLen(i32),
    /// A WRITE's payload this much longer or shorter than its `size`.
    Payload(i32),
    /// Cut to this fraction (per mille) of its length.
    Truncate(u16),
    /// These bytes overwritten.
    Flip(Vec<(u16, u8)>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => (-64..64i32).prop_map(Damage::HeaderLen),
        1 => (-64..64i32).prop_map(Damage::Payload),
        1 => (0..1000u16).prop_map(Damage::Truncate),
        1 => prop::collection::vec((any::<u16>(), any::<u8>()), 1..8).prop_map(Damage::Flip),
    ]
}

/// One generated request, before it is turned into bytes.
#[derive(Clone, Debug)]
struct Case {
    opcode: u32,
    unique: u64,
    nodeid: u64,
    offset: u64,
    length: u64,
    size: u32,
    /// SETATTR valid bits, FALLOCATE mode, LSEEK whence, OPEN flags.
    flags: u32,
    /// SETATTR mode; INIT minor.
    mode: u32,
    /// Trailing bytes for opcodes with no fixed arguments (names, unknown opcodes).
    extra: Vec<u8>,
    damage: Damage,
    /// Whether the request arrives in one buffer or split into head and tail.
    split: Option<u16>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            opcode(),
            any::<u64>(),
            prop_oneof![4 => Just(FUSE_ROOT_ID), 1 => any::<u64>()],
        ),
        (interesting_u64(), interesting_u64(), interesting_u32()),
        (interesting_u32(), any::<u32>()),
        prop::collection::vec(any::<u8>(), 0..64),
        damage(),
        prop::option::weighted(0.2, any::<u16>()),
    )
        .prop_map(
            |(
                (opcode, unique, nodeid),
                (offset, length, size),
                (flags, mode),
                extra,
                damage,
                split,
            )| Case {
                opcode,
                // Bit 0 marks INTERRUPT requests; keep it clear as the kernel does.
                unique: unique & !1,
                nodeid,
                offset,
                length,
                size,
                flags,
                mode,
                extra,
                damage,
                split,
            },
        )
}

/// The argument bytes of `c` (a WRITE's payload included).
fn args(c: &Case) -> Vec<u8> {
    match c.opcode {
        FUSE_READ => {
            let mut a = fuse_read_in::new_zeroed();
            (a.offset, a.size) = (c.offset, c.size);
            a.as_bytes().to_vec()
        }
        FUSE_WRITE => {
            let mut a = fuse_write_in::new_zeroed();
            // Keep the payload small enough to generate quickly.
            (a.offset, a.size) = (c.offset, c.size % (256 * 1024));
            let len = match c.damage {
                Damage::Payload(d) => (a.size as i64 + d as i64).max(0) as usize,
                _ => a.size as usize,
            };
            let mut bytes = a.as_bytes().to_vec();
            bytes.extend((0..len).map(|i| (i as u8) ^ (c.unique as u8)));
            bytes
        }
        FUSE_FALLOCATE => {
            let mut a = fuse_fallocate_in::new_zeroed();
            // Lengths past the image: keep fallocate from reserving real space.
            (a.offset, a.length, a.mode) = (c.offset, c.length % (4 * IMAGE), c.flags & 0x7f);
            a.as_bytes().to_vec()
        }
        FUSE_LSEEK => {
            let mut a = fuse_lseek_in::new_zeroed();
            (a.offset, a.whence) = (c.offset, c.flags % 6);
            a.as_bytes().to_vec()
        }
        FUSE_SETATTR => {
            let mut a = fuse_setattr_in::new_zeroed();
            a.valid = c.flags;
            // Sizes up to twice the image (a growable export grows that far, no further).
            a.size = c.length % (2 * IMAGE);
            (a.mode, a.uid, a.gid) = (c.mode, c.mode >> 3, c.mode >> 5);
            (a.atime, a.mtime, a.atimensec) = (c.offset, c.length, c.size);
            a.as_bytes().to_vec()
        }
        FUSE_OPEN => {
            let mut a = fuse_open_in::new_zeroed();
            (a.flags, a.open_flags) = (c.flags, c.mode);
            a.as_bytes().to_vec()
        }
        FUSE_GETATTR | FUSE_FSYNC => vec![0; 16],
        FUSE_FLUSH | FUSE_RELEASE => vec![0; 24],
        FUSE_INTERRUPT | FUSE_FORGET => c.offset.to_le_bytes().to_vec(),
        FUSE_LOOKUP => {
            let mut name: Vec<u8> = c.extra.iter().map(|b| b.max(&1)).copied().collect();
            name.push(0);
            name
        }
        op => match DIR_REQUEST_LAYOUTS.iter().find(|d| d.0 == op) {
            Some(&(_, fixed, names)) => dir_args(c, fixed, names),
            None => c.extra.clone(),
        },
    }
}

/// The request's bytes, damaged as `c.damage` says.
fn bytes(c: &Case) -> Vec<u8> {
    let args = args(c);
    let mut header = fuse_in_header::new_zeroed();
    header.len = (40 + args.len()) as u32;
    if let Damage::HeaderLen(d) = c.damage {
        header.len = (header.len as i64 + d as i64).clamp(0, u32::MAX as i64) as u32;
    }
    (header.opcode, header.unique, header.nodeid) = (c.opcode, c.unique, c.nodeid);
    (header.uid, header.gid, header.pid) = (1000, 1000, 4242);
    let mut bytes = [header.as_bytes(), &args].concat();
    match &c.damage {
        Damage::Truncate(per_mille) => bytes.truncate(bytes.len() * *per_mille as usize / 1000),
        Damage::Flip(flips) => {
            for &(at, b) in flips {
                let at = at as usize % bytes.len();
                bytes[at] = b;
            }
        }
        _ => {}
    }
    bytes
}

/// An 8-byte aligned copy, as the transports' request buffers are.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    words.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
    words
}

/// What `serve_request` sent for one request.
struct Sent {
    replies: usize,
    error: i32,
    payload: usize,
}

/// Serves `head` (+ `tail`) and checks every reply's header; returns what was sent.
fn serve(export: &Export, head: &[u8], tail: &[u8], data: &mut [u8]) -> Sent {
    let mut sent = Sent {
        replies: 0,
        error: 0,
        payload: 0,
    };
    let request_unique = header_of(head).map(|h| h.unique);
    serve_request(
        export,
        &Ctx::Blocking,
        head,
        tail,
        data,
        |reply: &Reply<'_>| {
            let h = *reply.header();
            let total: usize = reply.io_slices().iter().map(|s| s.len()).sum();
            assert_eq!(h.len as usize, total, "reply length vs bytes sent: {h:?}");
            assert!(
                (-4095..=0).contains(&h.error),
                "error {} out of range",
                h.error
            );
            if h.error != 0 {
                assert_eq!(total, 16, "an error reply has no payload");
            }
            assert_eq!(Some(h.unique), request_unique, "reply to another request");
            sent.replies += 1;
            sent.error = h.error;
            sent.payload = total - 16;
            Ok(total)
        },
    );
    sent
}

/// A well-formed request: a header around `args`.
fn well_formed(opcode: u32, unique: u64, args: &[u8]) -> Vec<u64> {
    let header = fuse_in_header {
        len: (40 + args.len()) as u32,
        opcode,
        unique,
        nodeid: FUSE_ROOT_ID,
        ..FromZeros::new_zeroed()
    };
    aligned(&[header.as_bytes(), args].concat())
}

/// The export still answers GETATTR and a READ of its first block.
fn assert_still_serving(export: &Export, data: &mut [u8]) {
    let head = well_formed(FUSE_GETATTR, 2, &[0; 16]);
    let sent = serve(export, &head.as_bytes()[..56], &[], data);
    assert_eq!(
        (sent.replies, sent.error),
        (1, 0),
        "GETATTR after the request"
    );
    let mut read = fuse_read_in::new_zeroed();
    read.size = 4096;
    let head = well_formed(FUSE_READ, 4, read.as_bytes());
    let sent = serve(export, &head.as_bytes()[..80], &[], data);
    assert_eq!((sent.replies, sent.error), (1, 0), "READ after the request");
    assert!(sent.payload <= 4096);
}

fn check(export: &Export, c: &Case, data: &mut [u8]) -> Result<(), TestCaseError> {
    let bytes = bytes(c);
    let words = aligned(&bytes);
    let all = &words.as_bytes()[..bytes.len()];
    let (head, tail) = match c.split {
        // The decoder needs the fixed arguments in the head; a split falls after them.
        Some(at) => all.split_at((at as usize % (all.len() + 1)).max(all.len().min(80))),
        None => (all, &[][..]),
    };
    let request = Request::decode(head, tail).ok();
    let decoded = request.as_ref().map(|r| r.opcode);
    // What the READ asks for as decoded (damage may have changed it from `c.size`).
    let read_size = match request.map(|r| r.op) {
        Some(Operation::Read { arg }) => Some(arg.size as usize),
        _ => None,
    };
    let sent = serve(export, head, tail, data);
    let must_reply = match decoded {
        Some(op) => expects_reply(op),
        None => header_of(head).is_some(),
    };
    prop_assert!(sent.replies <= 1, "{} replies", sent.replies);
    prop_assert_eq!(
        sent.replies,
        usize::from(must_reply),
        "decoded {:?}",
        decoded
    );
    if let (Some(size), 0) = (read_size, sent.error) {
        prop_assert!(
            sent.payload <= size,
            "READ of {} returned {} bytes",
            size,
            sent.payload
        );
    }
    assert_still_serving(export, data);
    Ok(())
}

/// A file image (writable, not growable) on disk in a temporary directory.
fn file_export(writable: bool) -> (tempfile::TempDir, Export) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("disk.img");
    let image: Vec<u8> = (0..IMAGE).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&image))
        .expect("write the image");
    let options = OpenOptions {
        writable,
        ..OpenOptions::default()
    };
    let backend = backend::open(path.to_str().expect("utf-8 path"), &options).expect("open");
    (dir, export(backend, writable, false))
}

fn export(backend: Arc<dyn BlockBackend>, writable: bool, growable: bool) -> Export {
    Export::new(
        backend,
        ExportOptions {
            writable,
            growable,
            ..ExportOptions::default()
        },
    )
}

fn null_export(writable: bool, growable: bool) -> Export {
    let options = OpenOptions {
        writable,
        ..OpenOptions::default()
    };
    let spec = format!("null:{IMAGE}");
    let backend = backend::open(&spec, &options).expect("null backend");
    export(backend, writable, growable)
}

thread_local! {
    /// One READ reply buffer per test thread (8-byte aligned; the transports' are
    /// page-aligned, which only O_DIRECT backends care about).
    static DATA_BUFFER: std::cell::RefCell<Vec<u64>> = std::cell::RefCell::new(vec![0u64; DATA / 8]);
}

/// Runs `check` with this thread's reply buffer.
fn with_data(f: impl FnOnce(&mut [u8]) -> Result<(), TestCaseError>) -> Result<(), TestCaseError> {
    DATA_BUFFER.with(|d| f(d.borrow_mut().as_mut_bytes()))
}

proptest! {
    #[test]
    fn writable_file_image_survives_any_request(c in case()) {
        thread_local! {
            static EXPORT: (tempfile::TempDir, Export) = file_export(true);
        }
        EXPORT.with(|(_, e)| with_data(|data| check(e, &c, data)))?;
    }

    #[test]
    fn read_only_null_export_survives_any_request(c in case()) {
        thread_local! {
            static EXPORT: Export = null_export(false, false);
        }
        EXPORT.with(|e| with_data(|data| check(e, &c, data)))?;
    }

    #[test]
    fn growable_null_export_survives_any_request(c in case()) {
        thread_local! {
            static EXPORT: Export = null_export(true, true);
        }
        EXPORT.with(|e| with_data(|data| check(e, &c, data)))?;
    }
}

/// The decoder alone, on bytes with no structure at all.
#[test]
fn random_bytes_never_panic_the_decoder() {
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&prop::collection::vec(any::<u8>(), 0..300), |bytes| {
            let words = aligned(&bytes);
            let head = &words.as_bytes()[..bytes.len()];
            let _ = Request::decode(head, &[]);
            let _ = header_of(head);
            Ok(())
        })
        .unwrap_or_else(|e| {
            let _ = writeln!(io::stderr(), "{e}");
            panic!("{e}")
        });
}
