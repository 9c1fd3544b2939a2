//! The file backend against std::fs, in every cell of the matrix: /tmp and tmpfs, buffered
//! and O_DIRECT, blocking and coroutine.

mod util;

use std::fs;
use std::io::{IoSlice, IoSliceMut};

use backend::AlignedBuf;
use backend::{BlockBackend, Extent, FileBackend, OpenOptions};
use util::{allocated, errno, matrix, pattern, read, read_split, write_split, Setup};

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

#[test]
fn read_write_agree_with_std() {
    matrix("read_write_agree_with_std", |s, cx| {
        let mut expect = pattern(64 * 1024, 1);
        let path = s.file("rw", &expect);
        let b = s.open(&path);
        // Unaligned offset, three unaligned iovecs.
        let data = pattern(5433, 2);
        write_split(&*b, cx, &data, &[100, 5000, 333], 777).unwrap();
        expect[777..777 + 5433].copy_from_slice(&data);
        assert_eq!(fs::read(&path).unwrap(), expect, "{}", s.label);
        // Aligned offset and memory: O_DIRECT's fast path.
        let mut buf = AlignedBuf::zeroed(8192);
        buf.copy_from_slice(&pattern(8192, 3));
        b.writev(cx, &[IoSlice::new(&buf)], 4096).unwrap();
        expect[4096..12288].copy_from_slice(&buf);
        assert_eq!(fs::read(&path).unwrap(), expect);
        // Reads: several iovecs at an unaligned offset, and an aligned one.
        assert_eq!(
            read_split(&*b, cx, &[1, 4095, 3000, 8192], 333),
            &expect[333..333 + 15288]
        );
        let mut buf = AlignedBuf::zeroed(16384);
        assert_eq!(
            b.readv(cx, &mut [IoSliceMut::new(&mut buf)], 8192).unwrap(),
            16384
        );
        assert_eq!(&buf[..], &expect[8192..8192 + 16384]);
    });
}

#[test]
fn writes_extend_to_the_exact_size() {
    matrix("writes_extend_to_the_exact_size", |s, cx| {
        let path = s.file("extend", &pattern(1000, 1));
        let b = s.open(&path);
        let mut expect = fs::read(&path).unwrap();
        write_split(&*b, cx, &pattern(100, 2), &[60, 40], 990).unwrap();
        expect.truncate(990);
        expect.extend(pattern(100, 2));
        assert_eq!(
            (b.len(), fs::read(&path).unwrap()),
            (1090, expect.clone()),
            "{}",
            s.label
        );
        // A write past the end leaves a gap of zeroes.
        b.writev(cx, &[IoSlice::new(b"tail")], 5000).unwrap();
        expect.resize(5000, 0);
        expect.extend(b"tail");
        assert_eq!((b.len(), fs::read(&path).unwrap()), (5004, expect));
    });
}

#[test]
fn reads_at_and_after_eof_are_short() {
    matrix("reads_at_and_after_eof_are_short", |s, cx| {
        let data = pattern(1000, 1);
        let b = s.open(&s.file("eof", &data));
        // 100 bytes are left: the read is short and the rest of the buffers untouched.
        let (mut x, mut y) = ([0xAAu8; 200], [0xAAu8; 100]);
        let n = b
            .readv(
                cx,
                &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)],
                900,
            )
            .unwrap();
        assert_eq!(
            (n, &x[..100], &x[100..], &y[..]),
            (100, &data[900..], &[0xAA; 100][..], &[0xAA; 100][..])
        );
        assert_eq!(read(&*b, cx, 10, 1000), b"", "at EOF");
        assert_eq!(read(&*b, cx, 10, 4096), b"", "past EOF");
        // An aligned read over an unaligned end of file.
        let mut buf = AlignedBuf::zeroed(4096);
        assert_eq!(
            b.readv(cx, &mut [IoSliceMut::new(&mut buf)], 0).unwrap(),
            1000,
            "{}",
            s.label
        );
        assert_eq!(&buf[..1000], &data[..]);
    });
}

#[test]
fn more_iovecs_than_iov_max() {
    matrix("more_iovecs_than_iov_max", |s, cx| {
        let b = s.open(&s.file("iovmax", &[]));
        let lens = vec![3; backend::IOV_MAX * 2 + 5];
        let data = pattern(lens.len() * 3, 4);
        write_split(&*b, cx, &data, &lens, 11).unwrap();
        assert_eq!(read_split(&*b, cx, &lens, 11), data, "{}", s.label);
    });
}

/// A 1 MiB image of data, flushed so that its blocks are allocated.
fn full_image(s: &Setup, name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let data = pattern(M as usize, 5);
    let path = s.file(name, &data);
    fs::File::open(&path).unwrap().sync_all().unwrap();
    (path, data)
}

#[test]
fn discard_reads_zeroes_and_frees_blocks() {
    matrix("discard_reads_zeroes_and_frees_blocks", |s, cx| {
        let (path, mut expect) = full_image(s, "discard");
        let b = s.open(&path);
        let before = allocated(&path);
        b.discard(cx, 256 * K, 512 * K).unwrap();
        expect[256 * K as usize..768 * K as usize].fill(0);
        assert_eq!((b.len(), fs::read(&path).unwrap()), (M, expect));
        let after = allocated(&path);
        assert!(
            after + 512 * K <= before,
            "{}: {before} -> {after} bytes allocated",
            s.label
        );
        assert_eq!(b.allocated_bytes().unwrap(), after);
    });
}

#[test]
fn write_zeroes_reads_zeroes() {
    matrix("write_zeroes_reads_zeroes", |s, cx| {
        let (path, mut expect) = full_image(s, "zeroes");
        let b = s.open(&path);
        let before = allocated(&path);
        // May unmap: a hole, blocks freed.
        b.write_zeroes(cx, 256 * K, 512 * K, true).unwrap();
        expect[256 * K as usize..768 * K as usize].fill(0);
        let after = allocated(&path);
        assert!(
            after + 512 * K <= before,
            "{}: {before} -> {after} bytes allocated",
            s.label
        );
        // Must stay allocated, unaligned range.
        b.write_zeroes(cx, 100, 5000, false).unwrap();
        expect[100..5100].fill(0);
        assert_eq!(fs::read(&path).unwrap(), expect, "{}", s.label);
        assert!(
            allocated(&path) >= after,
            "{}: allocation must not shrink",
            s.label
        );
        eprintln!(
            "  {}: allocated {before} -> {after} -> {}",
            b.describe(),
            allocated(&path)
        );
    });
}

#[test]
fn write_zeroes_past_the_end_grows() {
    matrix("write_zeroes_past_the_end_grows", |s, cx| {
        let path = s.file("zgrow", &pattern(1000, 6));
        let b = s.open(&path);
        let mut expect = fs::read(&path).unwrap();
        b.write_zeroes(cx, 900, 10_000, false).unwrap();
        expect.truncate(900);
        expect.resize(10_900, 0);
        assert_eq!(
            (b.len(), fs::read(&path).unwrap()),
            (10_900, expect.clone()),
            "{}",
            s.label
        );
        b.write_zeroes(cx, 20_000, 1000, true).unwrap();
        expect.resize(21_000, 0);
        assert_eq!((b.len(), fs::read(&path).unwrap()), (21_000, expect));
    });
}

#[test]
fn block_status_follows_the_layout() {
    matrix("block_status_follows_the_layout", |s, cx| {
        let b = s.open(&s.file("layout", &[]));
        // Data 0..4K, hole 4K..1M, data 1M..1M+4K.
        b.writev(cx, &[IoSlice::new(&pattern(4096, 1))], 0).unwrap();
        b.writev(cx, &[IoSlice::new(&pattern(4096, 2))], M).unwrap();
        let expect = [
            (0, Extent::data(4 * K)),
            (2048, Extent::data(4 * K)),
            (4 * K, Extent::hole(M)),
            (500 * K, Extent::hole(M)),
            (M, Extent::data(M + 4 * K)),
            (M + 4095, Extent::data(M + 4 * K)),
        ];
        for (offset, extent) in expect {
            assert_eq!(
                b.block_status(cx, offset).unwrap(),
                extent,
                "{} at {offset}",
                s.label
            );
        }
        for offset in [M + 4 * K, 10 * M] {
            assert_eq!(
                errno(&b.block_status(cx, offset).unwrap_err()),
                libc::ENXIO,
                "at {offset}"
            );
        }
        // A trailing hole after growing, and a hole where data was discarded.
        b.resize(cx, 2 * M).unwrap();
        assert_eq!(b.block_status(cx, M + 4 * K).unwrap(), Extent::hole(2 * M));
        b.discard(cx, 0, 4 * K).unwrap();
        assert_eq!(b.block_status(cx, 0).unwrap(), Extent::hole(M));
    });
}

#[test]
fn resize_grows_sparse_and_shrinks() {
    matrix("resize_grows_sparse_and_shrinks", |s, cx| {
        let path = s.file("resize", &pattern(4096, 7));
        let b = s.open(&path);
        b.resize(cx, 1 << 30).unwrap();
        assert_eq!(
            (b.len(), fs::metadata(&path).unwrap().len()),
            (1 << 30, 1 << 30)
        );
        assert!(
            b.allocated_bytes().unwrap() < M,
            "{}: growing allocated",
            s.label
        );
        assert_eq!(read(&*b, cx, 4096, 512 * M), vec![0; 4096]);
        b.resize(cx, 4196).unwrap();
        assert_eq!((b.len(), fs::metadata(&path).unwrap().len()), (4196, 4196));
        assert_eq!(
            read(&*b, cx, 200, 4096),
            vec![0; 100],
            "the grown tail reads as zeroes"
        );
    });
}

#[test]
fn read_only_refuses_changes() {
    matrix("read_only_refuses_changes", |s, cx| {
        let data = pattern(8192, 8);
        let path = s.file("ro", &data);
        let b = FileBackend::open(
            &path,
            &OpenOptions {
                writable: false,
                direct: s.direct,
                lock: false,
                format: backend::Format::Auto,
                snapshot: None,
            },
        )
        .unwrap();
        assert!(
            b.read_only() && b.describe().ends_with(", read-only)"),
            "{}",
            b.describe()
        );
        let refused = [
            b.writev(cx, &[IoSlice::new(b"x")], 0),
            b.discard(cx, 0, 4096),
            b.write_zeroes(cx, 0, 4096, true),
            b.resize(cx, 0),
        ];
        for result in refused {
            assert_eq!(errno(&result.unwrap_err()), libc::EROFS);
        }
        assert_eq!(read(&b, cx, 8192, 0), data);
        b.flush(cx).unwrap();
        assert_eq!(fs::read(&path).unwrap(), data);
    });
}

#[test]
fn flush_succeeds() {
    matrix("flush_succeeds", |s, cx| {
        let b = s.open(&s.file("flush", &pattern(100, 9)));
        b.writev(cx, &[IoSlice::new(b"abc")], 50).unwrap();
        b.flush(cx).unwrap();
    });
}

#[test]
fn describe_names_the_file_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.img");
    fs::write(&path, b"").unwrap();
    let b = FileBackend::open(
        &path,
        &OpenOptions {
            writable: true,
            direct: false,
            lock: false,
            format: backend::Format::Auto,
            snapshot: None,
        },
    )
    .unwrap();
    assert_eq!(b.describe(), format!("file:{} (buffered)", path.display()));
    assert_eq!((b.dio_align(), b.bounce_buffers_allocated()), (None, 0));
}

#[test]
fn empty_requests_change_nothing() {
    matrix("empty_requests_change_nothing", |s, cx| {
        let path = s.file("empty", &pattern(1000, 10));
        let b = s.open(&path);
        b.writev(cx, &[], 5000).unwrap();
        b.writev(cx, &[IoSlice::new(b"")], 6000).unwrap();
        b.write_zeroes(cx, 7000, 0, false).unwrap();
        b.discard(cx, 0, 0).unwrap();
        assert_eq!(
            (b.len(), fs::metadata(&path).unwrap().len()),
            (1000, 1000),
            "{}",
            s.label
        );
        assert_eq!(read_split(&*b, cx, &[], 0), b"");
    });
}
