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

/// Iovecs in one [`window_mut`] or [`window`]: a piece of a request that needs more is
/// done in several windows. On the stack, so taking a window never allocates.
pub(crate) const WINDOW: usize = 16;

/// Fills `out` with the bytes `[skip, skip + len)` of `bufs` (as far as [`WINDOW`] iovecs
/// and `bufs` reach). Returns the iovecs used and the bytes they cover.
pub(crate) fn window_mut<'a>(
    bufs: &'a mut [IoSliceMut<'_>],
    skip: usize,
    mut len: usize,
    out: &mut [IoSliceMut<'a>; WINDOW],
) -> (usize, usize) {
    let (first, mut within) = locate(bufs, skip);
    let (mut used, mut covered) = (0, 0);
    for b in bufs[first..].iter_mut() {
        if len == 0 || used == WINDOW {
            break;
        }
        let n = (b.len() - within).min(len);
        if n == 0 {
            continue; // an empty iovec
        }
        out[used] = IoSliceMut::new(&mut b[within..within + n]);
        (used, covered, len, within) = (used + 1, covered + n, len - n, 0);
    }
    (used, covered)
}

/// [`window_mut`] for the iovecs of a write.
pub(crate) fn window<'a>(
    bufs: &'a [IoSlice<'_>],
    skip: usize,
    mut len: usize,
    out: &mut [IoSlice<'a>; WINDOW],
) -> (usize, usize) {
    let (first, mut within) = locate(bufs, skip);
    let (mut used, mut covered) = (0, 0);
    for b in &bufs[first..] {
        if len == 0 || used == WINDOW {
            break;
        }
        let n = (b.len() - within).min(len);
        if n == 0 {
            continue; // an empty iovec
        }
        out[used] = IoSlice::new(&b[within..within + n]);
        (used, covered, len, within) = (used + 1, covered + n, len - n, 0);
    }
    (used, covered)
}

/// An empty window to fill with [`window_mut`].
pub(crate) fn empty_window_mut<'a>() -> [IoSliceMut<'a>; WINDOW] {
    std::array::from_fn(|_| IoSliceMut::new(&mut []))
}

/// An empty window to fill with [`window`].
pub(crate) fn empty_window<'a>() -> [IoSlice<'a>; WINDOW] {
    [IoSlice::new(&[]); WINDOW]
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

    #[test]
    fn windows_cover_a_piece_of_the_request() {
        let src = [
            IoSlice::new(b"ab"),
            IoSlice::new(b""),
            IoSlice::new(b"cdef"),
        ];
        let mut out = empty_window();
        let (used, covered) = window(&src, 1, 3, &mut out);
        assert_eq!((used, covered), (2, 3));
        assert_eq!((&*out[0], &*out[1]), (&b"b"[..], &b"cd"[..]));
        let (mut a, mut b) = ([1u8; 4], [2u8; 4]);
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        let mut out = empty_window_mut();
        let (used, covered) = window_mut(&mut bufs, 3, 100, &mut out);
        assert_eq!((used, covered), (2, 5));
        zero(&mut out[..used], covered);
        assert_eq!((a, b), ([1, 1, 1, 0], [0; 4]));
    }
}
