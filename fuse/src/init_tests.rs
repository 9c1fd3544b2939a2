//! INIT negotiation cases: current, old and future kernels, limits, io_uring.

use super::*;

/// What Linux 6.18 sends (see decode_tests INIT_REQUEST).
fn kernel_6_18() -> fuse_init_in {
    let mut arg = fuse_init_in::new_zeroed();
    (arg.major, arg.minor, arg.max_readahead) = (7, 45, 128 * 1024);
    arg.flags = 0x73ff_fffb;
    arg.flags2 = 0x5fd; // no OVER_IO_URING: enable_uring=N
    arg
}

fn accepted(reply: InitReply) -> (fuse_init_out, usize, Negotiated) {
    match reply {
        InitReply::Accepted {
            out,
            len,
            negotiated,
        } => (out, len, negotiated),
        other => panic!("not accepted: {other:?}"),
    }
}

#[test]
fn current_kernel_gets_1_mib_writes_and_default_flags() {
    let (out, len, n) = accepted(negotiate(&kernel_6_18(), &InitConfig::new()));
    assert_eq!(len, 64);
    assert_eq!((out.major, out.minor), (7, FUSE_KERNEL_MINOR_VERSION));
    assert_eq!(
        (out.max_write, out.max_pages, n.max_write),
        (1 << 20, 256, 1 << 20)
    );
    assert_eq!(u64::from(out.flags), DEFAULT_FLAGS | FUSE_INIT_EXT);
    assert_eq!(out.flags2, 0);
    assert_eq!(n.read_buffer_size(), 80 + (1 << 20));
    assert_eq!(out.max_readahead, 128 * 1024);
    assert!(n.has(FUSE_ASYNC_READ | FUSE_BIG_WRITES) && !n.has(FUSE_OVER_IO_URING));
}

#[test]
fn display_is_one_line() {
    let (_, _, n) = accepted(negotiate(&kernel_6_18(), &InitConfig::new()));
    assert_eq!(
        n.to_string(),
        "FUSE 7.45 (kernel 7.45): max_write=1048576 max_pages=256 max_readahead=131072 \
         read_buffer=1048656 flags=ASYNC_READ|BIG_WRITES|ASYNC_DIO|PARALLEL_DIROPS|MAX_PAGES|INIT_EXT"
    );
}

#[test]
fn io_uring_only_when_asked_and_offered() {
    let config = InitConfig {
        io_uring: true,
        ..InitConfig::new()
    };
    let (out, _, n) = accepted(negotiate(&kernel_6_18(), &config));
    assert!(
        !n.has(FUSE_OVER_IO_URING),
        "6.18 without enable_uring does not offer it"
    );
    assert_eq!(out.flags2, 0);
    let mut offered = kernel_6_18();
    offered.flags2 |= (FUSE_OVER_IO_URING >> 32) as u32;
    let (out, _, n) = accepted(negotiate(&offered, &config));
    assert!(n.has(FUSE_OVER_IO_URING));
    assert_eq!(out.flags2, 1 << 9);
    let (_, _, n) = accepted(negotiate(&offered, &InitConfig::new()));
    assert!(!n.has(FUSE_OVER_IO_URING), "offered but not asked");
}

#[test]
fn passthrough_carries_its_stack_depth() {
    let (out, _, _) = accepted(negotiate(&kernel_6_18(), &InitConfig::new()));
    assert_eq!(out.max_stack_depth, 0, "not asked: no depth");
    let config = InitConfig {
        flags: DEFAULT_FLAGS | FUSE_PASSTHROUGH,
        ..InitConfig::new()
    };
    let (out, _, n) = accepted(negotiate(&kernel_6_18(), &config));
    assert!(n.has(FUSE_PASSTHROUGH), "6.18 offers it (flags2 bit 5)");
    assert_eq!(out.flags2, 1 << 5);
    assert_eq!(out.max_stack_depth, FUSE_BACKING_STACKED_UNDER);
}

#[test]
fn max_pages_limit_bounds_max_write() {
    let config = InitConfig {
        max_pages_limit: 32,
        ..InitConfig::new()
    };
    let (out, _, n) = accepted(negotiate(&kernel_6_18(), &config));
    assert_eq!(
        (out.max_write, out.max_pages, n.max_write),
        (128 * 1024, 32, 128 * 1024)
    );
    let config = InitConfig {
        max_write: 100,
        ..InitConfig::new()
    };
    let (out, _, _) = accepted(negotiate(&kernel_6_18(), &config));
    assert_eq!(
        (out.max_write, out.max_pages),
        (4096, 1),
        "the kernel raises max_write to 4096"
    );
}

#[test]
fn kernel_before_7_36_has_no_flags2() {
    let mut old = kernel_6_18();
    (old.minor, old.flags, old.flags2) = (31, 0x03ff_fffb & !(FUSE_INIT_EXT as u32), 0xffff);
    let (out, len, n) = accepted(negotiate(
        &old,
        &InitConfig {
            io_uring: true,
            ..InitConfig::new()
        },
    ));
    assert_eq!((len, n.minor, n.kernel_minor), (64, 31, 31));
    assert_eq!(
        (out.flags2, n.flags >> 32),
        (0, 0),
        "flags2 ignored without INIT_EXT"
    );
    assert_eq!(u64::from(out.flags), DEFAULT_FLAGS);
}

#[test]
fn kernel_without_max_pages_gets_128_kib() {
    let mut old = kernel_6_18();
    (old.minor, old.flags) = (27, (FUSE_ASYNC_READ | FUSE_BIG_WRITES) as u32);
    let (out, _, n) = accepted(negotiate(&old, &InitConfig::new()));
    assert_eq!(
        (out.max_write, out.max_pages, n.max_pages),
        (128 * 1024, 0, 0)
    );
}

#[test]
fn ancient_kernels_get_short_replies() {
    let mut old = kernel_6_18();
    old.minor = 22;
    assert_eq!(accepted(negotiate(&old, &InitConfig::new())).1, 24);
    old.minor = 4;
    let (_, len, n) = accepted(negotiate(&old, &InitConfig::new()));
    assert_eq!((len, n.offered), (8, 0), "no flags before 7.6");
    assert_eq!(
        InitReply::Accepted {
            out: version_only(),
            len,
            negotiated: n
        }
        .reply(3)
        .len(),
        16 + 8
    );
}

#[test]
fn other_majors() {
    let mut future = kernel_6_18();
    future.major = 8;
    let InitReply::Retry { out } = negotiate(&future, &InitConfig::new()) else {
        panic!()
    };
    assert_eq!(
        (out.major, out.minor, out.flags, out.max_write),
        (7, FUSE_KERNEL_MINOR_VERSION, 0, 0)
    );
    assert_eq!(
        negotiate(&future, &InitConfig::new()).reply(5).len(),
        16 + 64
    );
    future.major = 6;
    assert_eq!(
        negotiate(&future, &InitConfig::new()),
        InitReply::Refused(Errno::EPROTO)
    );
    assert_eq!(
        negotiate(&future, &InitConfig::new())
            .reply(5)
            .header()
            .error,
        -libc::EPROTO
    );
}

#[test]
fn buffer_sizes() {
    assert_eq!(min_read_buffer(0), 8192);
    assert_eq!(min_read_buffer(4096), 8192);
    assert_eq!(min_read_buffer(1 << 20), (1 << 20) + 80);
    assert_eq!(RECOMMENDED_HEAD_SIZE, 4176);
    assert_eq!(
        tail_size(RECOMMENDED_HEAD_SIZE, 1 << 20),
        (1 << 20) + 80 - 4176
    );
    assert_eq!(tail_size(RECOMMENDED_HEAD_SIZE, 0), 8192 - 4176);
}

#[test]
fn a_wish_above_bit_31_travels_in_flags2() {
    let config = InitConfig {
        flags: DEFAULT_FLAGS | FUSE_DIRECT_IO_ALLOW_MMAP,
        ..InitConfig::new()
    };
    let (out, _, n) = accepted(negotiate(&kernel_6_18(), &config));
    assert_eq!(out.flags2, (FUSE_DIRECT_IO_ALLOW_MMAP >> 32) as u32);
    assert!(n.has(FUSE_DIRECT_IO_ALLOW_MMAP));
    let mut old = kernel_6_18();
    (old.minor, old.flags, old.flags2) = (31, 0x03ff_fffb & !(FUSE_INIT_EXT as u32), 0xffff);
    let (out, _, n) = accepted(negotiate(&old, &config));
    assert_eq!(out.flags2, 0, "no flags2 without INIT_EXT");
    assert!(!n.has(FUSE_DIRECT_IO_ALLOW_MMAP));
}
