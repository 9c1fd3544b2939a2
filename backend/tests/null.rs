//! The null backend in both contexts: size, zeroes, dropped writes, holes.

mod util;

use std::io::{IoSlice, IoSliceMut};

use backend::{open, BlockBackend, Ctx, Extent, NullBackend, OpenOptions};
use util::{each_ctx, errno};

const G: u64 = 1 << 30;

#[test]
fn null_reads_zeroes_up_to_its_size() {
    each_ctx(|cx| {
        let b = open("null:1G", &OpenOptions::default()).unwrap();
        assert_eq!((b.len(), b.allocated_bytes().unwrap()), (G, 0));
        let (mut x, mut y) = ([0xAAu8; 3], [0xAAu8; 4093]);
        let mut bufs = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
        assert_eq!(b.readv(cx, &mut bufs, 12345).unwrap(), 4096);
        assert!(x.iter().chain(&y).all(|&v| v == 0));
        // Short at the end, nothing past it.
        let mut buf = [0xAAu8; 4096];
        assert_eq!(
            b.readv(cx, &mut [IoSliceMut::new(&mut buf)], G - 100)
                .unwrap(),
            100
        );
        assert_eq!((buf[99], buf[100]), (0, 0xAA));
        assert_eq!(b.readv(cx, &mut [IoSliceMut::new(&mut buf)], G).unwrap(), 0);
    });
}

#[test]
fn null_drops_writes_and_resizes() {
    each_ctx(|cx| {
        let b = NullBackend::new(4096, true);
        b.writev(cx, &[IoSlice::new(&[1u8; 512])], 0).unwrap();
        b.writev(cx, &[IoSlice::new(&[1u8; 512])], 8192).unwrap(); // never extends
        let mut buf = [0xAAu8; 512];
        assert_eq!(
            b.readv(cx, &mut [IoSliceMut::new(&mut buf)], 0).unwrap(),
            512
        );
        assert_eq!((buf, b.len()), ([0; 512], 4096));
        b.flush(cx).unwrap();
        b.discard(cx, 0, 4096).unwrap();
        b.write_zeroes(cx, 0, 4096, false).unwrap();
        b.resize(cx, 3 * G).unwrap();
        assert_eq!(b.len(), 3 * G);
        assert_eq!(b.describe(), "null:3221225472 (reads zeroes, drops writes)");
    });
}

#[test]
fn null_is_one_hole() {
    let b = NullBackend::new(G, true);
    assert_eq!(b.block_status(&Ctx::Blocking, 0).unwrap(), Extent::hole(G));
    assert_eq!(
        b.block_status(&Ctx::Blocking, G - 1).unwrap(),
        Extent::hole(G)
    );
    assert_eq!(
        errno(&b.block_status(&Ctx::Blocking, G).unwrap_err()),
        libc::ENXIO
    );
}

#[test]
fn read_only_null_refuses_changes() {
    each_ctx(|cx: &Ctx<'_>| {
        let b = open("null:4K", &OpenOptions::default()).unwrap();
        assert!(b.read_only());
        assert_eq!(
            errno(&b.writev(cx, &[IoSlice::new(b"x")], 0).unwrap_err()),
            libc::EROFS
        );
        assert_eq!(errno(&b.resize(cx, 0).unwrap_err()), libc::EROFS);
        assert_eq!(b.len(), 4096);
    });
}
