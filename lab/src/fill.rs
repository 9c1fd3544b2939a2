//! What the lab's images hold: non-zero pseudo-random bytes, each MiB stamped with its
//! index, written front to back.
//!
//! Why: reads must copy real bytes (no layer may short-cut zeroes), and every block must
//! be written, not a hole or an unwritten extent, so that reads come from the medium and
//! O_DIRECT writes take the overwrite path. Both images (tmpfs and real storage) are
//! written by [`write_image`].

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::interrupt;
use super::load::AlignedBuf;

/// Bytes per write: 8 MiB (a multiple of every O_DIRECT alignment).
pub const CHUNK: usize = 8 << 20;

/// Writes `size` bytes (a multiple of 1 MiB) of the pattern to `file` from its start.
/// With O_DIRECT the buffer is page-aligned and every write a whole [`CHUNK`] (or the
/// MiB-multiple tail), as O_DIRECT wants. Stops on Ctrl-C.
pub fn write_image(mut file: &File, path: &Path, size: u64) -> Result<(), String> {
    if size % (1 << 20) != 0 {
        return Err(format!("image size {size} is not a multiple of 1 MiB"));
    }
    let mut buf = AlignedBuf::new(1, CHUNK)?;
    let chunk = buf.as_mut_slice();
    let block = pattern();
    for mib in chunk.chunks_exact_mut(1 << 20) {
        mib.copy_from_slice(&block);
    }
    let mut done = 0u64;
    while done < size {
        interrupt::check()?;
        let len = (size - done).min(CHUNK as u64) as usize;
        for (i, mib) in chunk[..len].chunks_exact_mut(1 << 20).enumerate() {
            stamp(mib, (done >> 20) + i as u64);
        }
        file.write_all(&chunk[..len])
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        done += len as u64;
    }
    Ok(())
}

/// One MiB in which no byte is zero (xorshift64, each word or-ed with 0x01 bytes).
fn pattern() -> Vec<u8> {
    let mut block = vec![0u8; 1 << 20];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for (i, word) in block.chunks_exact_mut(8).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        word.copy_from_slice(&(x | 0x0101_0101_0101_0101 | i as u64).to_le_bytes());
    }
    block
}

/// Marks a MiB with its index, so that no two MiBs of an image are equal: 7 bits of the
/// index per byte, the top bit set so that no byte is zero.
fn stamp(mib: &mut [u8], index: u64) {
    for (i, b) in mib[..8].iter_mut().enumerate() {
        *b = 0x80 | (index >> (7 * i)) as u8 & 0x7f;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_has_no_zero_byte_and_stamps_differ() {
        let block = pattern();
        assert_eq!(block.len(), 1 << 20);
        assert!(block.iter().all(|&b| b != 0));
        let (mut a, mut b) = (block.clone(), block);
        stamp(&mut a, 0);
        stamp(&mut b, 128);
        assert_ne!(a, b);
        assert!(a.iter().all(|&x| x != 0), "the stamp keeps bytes non-zero");
    }
}
