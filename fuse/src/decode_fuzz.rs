//! Randomized no-panic test of the decoder: random, truncated and mutated
//! buffers, random head/tail splits and misaligned heads. A plain xorshift
//! generator keeps it deterministic and dependency-free.

use super::tests::{request, Aligned, FIXED_ARGS};
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

/// A buffer built from a valid request, then truncated, mutated or replaced.
fn random_request(rng: &mut XorShift) -> Vec<u8> {
    let (opcode, size) = FIXED_ARGS[rng.below(FIXED_ARGS.len())];
    let opcode = if rng.below(8) == 0 {
        rng.next() as u32 % 64
    } else {
        opcode
    };
    let mut bytes = request(opcode, rng.next(), &vec![0; size + rng.below(48)]);
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
        if let Ok(req) = Request::decode(head, tail) {
            accepted += 1;
            let _ = req.to_string();
            if let Operation::Write { data, .. } = req.op {
                data.copy_to(&mut scratch);
            }
        }
    }
    assert!(
        accepted > 1000,
        "the generator should produce valid requests too ({accepted})"
    );
}
