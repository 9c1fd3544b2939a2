//! Concurrent requests on one image: coroutines of one loop, or threads. With O_DIRECT,
//! unaligned writes into one block are read-modify-write cycles; none may undo another.

mod util;

use std::fs;
use std::io::IoSlice;
use std::sync::Arc;

use backend::{BlockBackend, Ctx, FileBackend};
use util::{matrix, read};

const WRITERS: usize = 8;

/// Runs `job(i)` for each writer at once: coroutines in coroutine mode, threads otherwise.
fn run_writers(b: &Arc<FileBackend>, cx: &Ctx<'_>, job: fn(&FileBackend, &Ctx<'_>, usize)) {
    match cx {
        Ctx::Coroutine(co) => {
            let spawn = |i| {
                let b = Arc::clone(b);
                co.spawn_joinable(move |co| job(&b, &Ctx::Coroutine(co), i))
                    .unwrap()
            };
            let handles: Vec<_> = (0..WRITERS).map(spawn).collect();
            handles.into_iter().for_each(|h| h.join(co).unwrap());
        }
        Ctx::Blocking => std::thread::scope(|scope| {
            for i in 0..WRITERS {
                scope.spawn(move || job(b, &Ctx::Blocking, i));
            }
        }),
    }
}

/// Writer `i` owns bytes `[i * 64, i * 64 + 64)` of every 512-byte block.
fn slot_writer(b: &FileBackend, cx: &Ctx<'_>, i: usize) {
    for block in 0..8u64 {
        let data = [i as u8 + 1; 64];
        b.writev(cx, &[IoSlice::new(&data)], block * 512 + i as u64 * 64)
            .unwrap();
    }
}

#[test]
fn unaligned_writes_to_shared_blocks_keep_every_byte() {
    matrix(
        "unaligned_writes_to_shared_blocks_keep_every_byte",
        |s, cx| {
            let path = s.file("slots", &[0u8; 4096]);
            let b = s.open(&path);
            run_writers(&b, cx, slot_writer);
            let expect: Vec<u8> = (0..4096).map(|n| (n % 512 / 64) as u8 + 1).collect();
            assert_eq!(fs::read(&path).unwrap(), expect, "{}", s.label);
            assert!(b.bounce_buffers_allocated() <= WRITERS as u64);
        },
    );
}

/// Writer `i` appends 100 bytes at `8192 + i * 100`, past the end.
fn append_writer(b: &FileBackend, cx: &Ctx<'_>, i: usize) {
    let data = [i as u8 + 1; 100];
    b.writev(cx, &[IoSlice::new(&data)], 8192 + i as u64 * 100)
        .unwrap();
}

#[test]
fn concurrent_extending_writes_keep_every_byte() {
    matrix("concurrent_extending_writes_keep_every_byte", |s, cx| {
        let path = s.file("append", &[0u8; 8192]);
        let b = s.open(&path);
        run_writers(&b, cx, append_writer);
        let end = 8192 + WRITERS * 100;
        let mut expect = vec![0u8; 8192];
        expect.extend((0..WRITERS * 100).map(|n| (n / 100) as u8 + 1));
        assert_eq!(
            (b.len(), fs::read(&path).unwrap()),
            (end as u64, expect),
            "{}",
            s.label
        );
    });
}

#[test]
fn bounce_buffers_are_reused() {
    matrix("bounce_buffers_are_reused", |s, cx| {
        let b = s.open(&s.file("reuse", &[0u8; 65536]));
        for i in 0..200u64 {
            b.writev(cx, &[IoSlice::new(&[i as u8; 300])], i * 317)
                .unwrap();
            assert_eq!(read(&*b, cx, 300, i * 317), vec![i as u8; 300]);
        }
        let expected = if s.direct { 1 } else { 0 };
        assert_eq!(
            b.bounce_buffers_allocated(),
            expected,
            "{}: one request at a time",
            s.label
        );
        if let Some((mem, off)) = b.dio_align() {
            assert!(mem.is_power_of_two() && off.is_power_of_two());
            eprintln!("  {}", b.describe());
        }
    });
}
