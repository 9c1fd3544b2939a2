//! Page-aligned I/O buffers: O_DIRECT needs aligned memory, and `Vec<u8>` does not
//! promise it.

/// The alignment O_DIRECT wants here (a page).
pub const ALIGN: usize = backend::PAGE_ALIGN;

/// `slots` buffers of `len` bytes each, contiguous, page-aligned, zero-initialised: slots
/// of one [`backend::AlignedBuf`].
pub struct AlignedBuf {
    mem: backend::AlignedBuf,
    len: usize,
}

impl AlignedBuf {
    /// Allocates `slots * len` bytes; `len` is rounded up to a page so every slot stays
    /// aligned.
    pub fn new(slots: usize, len: usize) -> Result<AlignedBuf, String> {
        let stride = len.next_multiple_of(ALIGN);
        let size = stride
            .checked_mul(slots)
            .filter(|&s| s > 0 && s < isize::MAX as usize / 2)
            .ok_or("buffer size overflows: lower --bs or --iodepth")?;
        Ok(AlignedBuf {
            mem: backend::AlignedBuf::zeroed(size),
            len: stride,
        })
    }

    /// Bytes per slot (a multiple of [`ALIGN`]).
    #[cfg(test)]
    pub fn slot_len(&self) -> usize {
        self.len
    }

    /// All slots as one slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    /// Slot `i`, for a blocking call.
    pub fn slot(&mut self, i: usize) -> &mut [u8] {
        let len = self.len;
        &mut self.as_mut_slice()[i * len..(i + 1) * len]
    }

    /// Raw pointer to slot `i`, for a request the kernel completes later. The caller
    /// keeps `self` alive until that request's completion has been reaped.
    pub fn slot_ptr(&mut self, i: usize) -> *mut u8 {
        self.slot(i).as_mut_ptr()
    }

    /// Fills every slot with a non-zero pattern, so writes carry real data.
    pub fn fill_pattern(&mut self) {
        for (i, b) in self.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8 | 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned() {
        let mut b = AlignedBuf::new(3, 5000).expect("alloc");
        assert_eq!(b.slot_len(), 8192);
        for i in 0..3 {
            assert_eq!(b.slot_ptr(i) as usize % ALIGN, 0);
        }
        b.fill_pattern();
        assert!(b.as_mut_slice().iter().all(|&x| x != 0));
    }
}
