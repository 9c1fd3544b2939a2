//! Randomized no-panic test of the decoder: random, truncated and mutated
//! buffers, random head/tail splits and misaligned heads, for every opcode
//! with fixed arguments and every opcode with names (random names, NULs
//! inside them, SETXATTR values), with and without FUSE_SETXATTR_EXT. A
//! plain xorshift generator keeps it deterministic and dependency-free.

use super::dir_tests::named_args;
use super::tests::{request, Aligned, FIXED_ARGS};
use super::{Features, DIR_REQUEST_LAYOUTS};
use crate::abi::{FUSE_SETXATTR, FUSE_SETXATTR_EXT};
use crate::request::{Operation, Request};

/// xorshift64: a tiny deterministic generator, enough to shake the decoder.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A name of 0 to 15 bytes other than NUL (empty ones are rejected), with its NUL.
fn random_name(rng: &mut XorShift) -> Vec<u8> {
    let mut name: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8 | 1).collect();
    name.push(0);
    name
}

/// The arguments of an opcode of [`DIR_REQUEST_LAYOUTS`] (names, if any, random), mostly
/// well-formed.
fn random_dir_args(rng: &mut XorShift) -> (u32, Vec<u8>) {
    let (opcode, fixed, count) = DIR_REQUEST_LAYOUTS[rng.below(DIR_REQUEST_LAYOUTS.len())];
    let names: Vec<Vec<u8>> = (0..count).map(|_| random_name(rng)).collect();
    let names: Vec<&[u8]> = names.iter().map(|n| &n[..]).collect();
    let fixed = fixed + 8 * usize::from(opcode == FUSE_SETXATTR && rng.below(2) == 0);
    let mut args = named_args(fixed, &names);
    if opcode == FUSE_SETXATTR {
        let value = rng.below(24);
        args[..4].copy_from_slice(&(value as u32).to_le_bytes());
        args.extend((0..value).map(|_| rng.next() as u8));
    }
    (opcode, args)
}

/// The arguments of an opcode with fixed arguments (or any opcode), plus extra bytes.
fn random_fixed_args(rng: &mut XorShift) -> (u32, Vec<u8>) {
    let (opcode, size) = FIXED_ARGS[rng.below(FIXED_ARGS.len())];
    let opcode = if rng.below(8) == 0 {
        rng.next() as u32 % 64
    } else {
        opcode
    };
    (opcode, vec![0; size + rng.below(48)])
}

/// A buffer built from a valid request, then truncated, mutated or replaced.
fn random_request(rng: &mut XorShift) -> Vec<u8> {
    let (opcode, args) = match rng.below(2) {
        0 => random_fixed_args(rng),
        _ => random_dir_args(rng),
    };
    let mut bytes = request(opcode, rng.next(), &args);
    for _ in 0..rng.below(6) {
        let at = rng.below(bytes.len());
        bytes[at] = rng.next() as u8;
    }
    match rng.below(4) {
        0 => bytes.truncate(rng.below(bytes.len() + 1)),
        1 => bytes.iter_mut().for_each(|b| *b = rng.next() as u8),
        _ => {}
    }
    if rng.below(2) == 0 && bytes.len() >= 4 {
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_le_bytes());
    }
    bytes
}

/// Decoding never panics, and anything it accepts can be logged and copied.
#[test]
fn random_buffers_never_panic() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut scratch = [0u8; 256];
    let mut accepted = 0;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200_000 {
        let bytes = random_request(&mut rng);
        let skew = if rng.below(16) == 0 {
            1 + rng.below(7)
        } else {
            0
        };
        let buf = Aligned::new(&[vec![0; skew], bytes].concat());
        let all = &buf.bytes()[skew..];
        let (head, tail) = all.split_at(rng.below(all.len() + 1));
        let features = Features::from_flags(FUSE_SETXATTR_EXT * (rng.below(2) as u64));
        if let Ok(req) = Request::decode_with(head, tail, features) {
            accepted += 1;
            seen.insert(req.opcode);
            let _ = req.to_string();
            match req.op {
                Operation::Write { data, .. } | Operation::Setxattr { value: data, .. } => {
                    data.copy_to(&mut scratch);
                }
                _ => {}
            }
        }
    }
    assert!(
        accepted > 1000,
        "the generator should produce valid requests too ({accepted})"
    );
    let opcodes = FIXED_ARGS
        .iter()
        .map(|a| a.0)
        .chain(DIR_REQUEST_LAYOUTS.iter().map(|a| a.0));
    for opcode in opcodes {
        assert!(
            seen.contains(&opcode),
            "no valid request of opcode {opcode}"
        );
    }
}
