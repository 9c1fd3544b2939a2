//! [`AlignedBuf`]: a zeroed heap buffer at an aligned address, for O_DIRECT (which needs
//! the memory aligned, not only the offsets): the backend's bounce buffers, the lab's load
//! and the tests all use this one.
//!
//! Alignment needs no unsafe code: the buffer over-allocates by `align - 1` bytes and uses
//! the aligned window inside. Memory comes zeroed from the allocator, so untouched pages of
//! a large buffer stay unmapped until used.

use std::ops::{Deref, DerefMut};

/// The alignment [`AlignedBuf::zeroed`] gives: a page, enough for O_DIRECT anywhere.
pub const PAGE_ALIGN: usize = 4096;

/// A heap buffer whose usable bytes start at an `align`-aligned address.
pub struct AlignedBuf {
    mem: Box<[u8]>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes at an address that is a multiple of `align` (a power of two).
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let mem = vec![0u8; len + align - 1].into_boxed_slice();
        let addr = mem.as_ptr() as usize;
        let start = addr.next_multiple_of(align) - addr;
        AlignedBuf { mem, start, len }
    }

    /// `len` zeroed bytes, page-aligned ([`PAGE_ALIGN`]).
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf::new(len, PAGE_ALIGN)
    }

    /// A page-aligned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes at {:p})", self.len, self.as_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_of_their_length() {
        for (len, align) in [(0, 512), (1, 4096), (4096, 4096), (10_000, 512), (3, 2)] {
            let b = AlignedBuf::new(len, align);
            assert_eq!((b.len(), b.as_ptr() as usize % align), (len, 0));
            assert!(b.iter().all(|&x| x == 0));
        }
        let copy = AlignedBuf::from_slice(b"abc");
        assert_eq!(
            (&copy[..], copy.as_ptr() as usize % PAGE_ALIGN),
            (&b"abc"[..], 0)
        );
    }
}
