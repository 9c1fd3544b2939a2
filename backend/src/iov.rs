//! Helpers over the caller's iovecs: lengths, positions, and copies to or from a flat
//! buffer (the bounce path and the null backend). The iovec arrays are never modified.

use std::io::{IoSlice, IoSliceMut};
use std::ops::Deref;

/// Total bytes described by `bufs`.
pub(crate) fn total<B: Deref<Target = [u8]>>(bufs: &[B]) -> usize {
    bufs.iter().map(|b| b.len()).sum()
}

/// The iovec holding logical byte `skip`, and the offset inside it; `(bufs.len(), 0)` when
/// `skip` is at or past the end.
pub(crate) fn locate<B: Deref<Target = [u8]>>(bufs: &[B], mut skip: usize) -> (usize, usize) {
    for (i, b) in bufs.iter().enumerate() {
        if skip < b.len() {
            return (i, skip);
        }
        skip -= b.len();
    }
    (bufs.len(), 0)
}

/// Copies `src` into `bufs` from logical byte `skip` on, as far as `bufs` reaches.
pub(crate) fn scatter(bufs: &mut [IoSliceMut<'_>], skip: usize, mut src: &[u8]) {
    let (first, mut within) = locate(bufs, skip);
    for b in bufs[first..].iter_mut() {
        if src.is_empty() {
            break;
        }
        let n = (b.len() - within).min(src.len());
        b[within..within + n].copy_from_slice(&src[..n]);
        (src, within) = (&src[n..], 0);
    }
}

/// Copies bytes of `bufs` from logical byte `skip` on into `dst`, as far as `bufs` reaches.
pub(crate) fn gather(bufs: &[IoSlice<'_>], skip: usize, mut dst: &mut [u8]) {
    let (first, mut within) = locate(bufs, skip);
    for b in &bufs[first..] {
        if dst.is_empty() {
            break;
        }
        let n = (b.len() - within).min(dst.len());
        dst[..n].copy_from_slice(&b[within..within + n]);
        (dst, within) = (&mut dst[n..], 0);
    }
}

/// Zeroes the first `len` bytes described by `bufs`.
pub(crate) fn zero(bufs: &mut [IoSliceMut<'_>], mut len: usize) {
    for b in bufs.iter_mut() {
        let n = b.len().min(len);
        b[..n].fill(0);
        len -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_and_gather_cross_iovecs() {
        let (mut a, mut b, mut c) = ([0u8; 3], [0u8; 0], [0u8; 4]);
        let mut bufs = [
            IoSliceMut::new(&mut a),
            IoSliceMut::new(&mut b),
            IoSliceMut::new(&mut c),
        ];
        assert_eq!(locate(&bufs, 3), (2, 0)); // the empty iovec is skipped
        scatter(&mut bufs, 2, b"xyz");
        assert_eq!((a, c), ([0, 0, b'x'], *b"yz\0\0"));
        let src = [IoSlice::new(b"ab"), IoSlice::new(b"cdef")];
        let mut dst = [0u8; 3];
        gather(&src, 1, &mut dst);
        assert_eq!(&dst, b"bcd");
    }
}
