//! Hostile requests against the directory export, property-based (proptest, stable Rust):
//! every opcode the decoder knows, with arguments of random bytes, names drawn from a small
//! set (so that requests meet the same files: create, then rename, then unlink...), node
//! ids and file handles both valid and not, sent to a `DirFs` on a temporary tree.
//!
//! Properties, for every request: no panic; exactly one reply when the opcode takes one,
//! with a consistent header (its length the bytes sent, its error 0 or an errno, an error
//! without payload); afterwards the root still answers GETATTR. The source
//! tree never leaks out of its directory: `..` of the root is the root, so a name can
//! only reach files below the temporary directory (checked by the tree staying inside it).
//! `PROPTEST_CASES=100000 cargo test --release -p corofuse-dir --test fuzz` for a long run.

use std::ffi::CString;

use dir_export::{DirFs, DirOptions, ROOT};
use fuse::abi::*;
use fuse::decode::DIR_REQUEST_LAYOUTS;
use fuse::request::expects_reply;
use fuse::Request;
use proptest::prelude::*;
use runtime::Ctx;
use transport::FileSystem;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

/// Names requests use: a few files and directories, the dots, and one that is too long.
const NAMES: [&str; 8] = ["a", "b", "dir", "..", ".", "sub", "x.tmp", "file"];

/// The fixed-size opcodes of the image export too, with their argument sizes.
const FILE_OPS: [(u32, usize); 11] = [
    (FUSE_GETATTR, 16),
    (FUSE_SETATTR, 88),
    (FUSE_OPEN, 8),
    (FUSE_READ, 40),
    (FUSE_WRITE, 40),
    (FUSE_RELEASE, 24),
    (FUSE_FLUSH, 24),
    (FUSE_FSYNC, 16),
    (FUSE_FALLOCATE, 32),
    (FUSE_LSEEK, 24),
    (FUSE_FORGET, 8),
];

#[derive(Clone, Debug)]
struct Case {
    /// Index into the layouts (dir ops first, then file ops).
    op: usize,
    nodeid: u64,
    args: Vec<u8>,
    names: [usize; 2],
    /// Small values patched over the argument's first words (fh, offsets, sizes, flags).
    words: [u64; 3],
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..DIR_REQUEST_LAYOUTS.len() + FILE_OPS.len(),
        prop_oneof![4 => 1..8u64, 1 => any::<u64>()],
        prop::collection::vec(any::<u8>(), 0..96),
        [0..NAMES.len(), 0..NAMES.len()],
        [0..8u64, 0..70_000u64, 0..5000u64],
    )
        .prop_map(|(op, nodeid, args, names, words)| Case {
            op,
            nodeid,
            args,
            names,
            words,
        })
}

/// The request's bytes: header, the argument struct (random, first words patched), names.
fn bytes(c: &Case) -> Vec<u8> {
    let (opcode, size, names) = match DIR_REQUEST_LAYOUTS.get(c.op) {
        Some(&(op, size, names)) => (op, size, names),
        None => {
            let (op, size) = FILE_OPS[c.op - DIR_REQUEST_LAYOUTS.len()];
            (op, size, 0)
        }
    };
    let mut arg = c.args.clone();
    arg.resize(size, 0);
    for (i, w) in c.words.iter().enumerate() {
        if arg.len() >= (i + 1) * 8 {
            arg[i * 8..(i + 1) * 8].copy_from_slice(&w.to_le_bytes());
        }
    }
    let mut body = arg;
    for &n in &c.names[..names] {
        body.extend(CString::new(NAMES[n]).unwrap().as_bytes_with_nul());
    }
    if opcode == FUSE_WRITE {
        // A WRITE's payload: as many bytes as its size says (capped).
        let len = (c.words[2] as usize).min(4096);
        body[16..20].copy_from_slice(&(len as u32).to_le_bytes());
        body.extend(std::iter::repeat_n(0x5a, len));
    }
    let header = fuse_in_header {
        len: (40 + body.len()) as u32,
        opcode,
        unique: 2,
        nodeid: c.nodeid,
        ..FromZeros::new_zeroed()
    };
    [header.as_bytes(), &body].concat()
}

/// Serves `bytes` and checks the reply; returns its error (None: no reply).
fn serve(fs: &DirFs, bytes: &[u8], data: &mut [u8]) -> Option<i32> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    words.as_mut_bytes()[..bytes.len()].copy_from_slice(bytes);
    let head = &words.as_bytes()[..bytes.len()];
    let req = Request::decode(head, &[]).ok()?;
    let mut scratch = Default::default();
    let data: &mut [u8] = if req.op.kind().needs_data_buffer() {
        data
    } else {
        &mut []
    };
    let reply = fs.handle(&Ctx::Blocking, &req, &mut scratch, data);
    assert_eq!(
        reply.is_some(),
        expects_reply(req.opcode),
        "opcode {}",
        req.opcode
    );
    let reply = reply?;
    let out: Vec<u8> = reply.io_slices().iter().flat_map(|s| s.to_vec()).collect();
    let (h, _) = fuse_out_header::read_from_prefix(&out).unwrap();
    assert_eq!(h.len as usize, out.len());
    assert!((-4095..=0).contains(&h.error));
    if h.error != 0 {
        assert_eq!(out.len(), 16);
    }
    Some(h.error)
}

proptest! {
    #[test]
    fn the_directory_export_survives_any_request(c in case()) {
        thread_local! {
            static SETUP: (tempfile::TempDir, DirFs, std::cell::RefCell<Vec<u8>>) = {
                let dir = tempfile::tempdir().unwrap();
                let src = dir.path().join("src");
                std::fs::create_dir_all(src.join("dir/sub")).unwrap();
                std::fs::write(src.join("a"), b"some data").unwrap();
                let fs = DirFs::new(&src, DirOptions::default()).unwrap();
                (dir, fs, std::cell::RefCell::new(vec![0; 1 << 20]))
            };
        }
        SETUP.with(|(dir, fs, data)| {
            let mut data = data.borrow_mut();
            serve(fs, &bytes(&c), &mut data);
            // Still serving: GETATTR of the root, and a listing of it.
            let getattr = bytes(&Case { op: DIR_REQUEST_LAYOUTS.len(), nodeid: ROOT, args: vec![], names: [0, 0], words: [0, 0, 0] });
            assert_eq!(serve(fs, &getattr, &mut data), Some(0), "GETATTR of the root");
            // Nothing was made outside the temporary directory's `src`.
            let outside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(outside.len(), 1, "only src/ in the temporary directory");
        });
    }
}
