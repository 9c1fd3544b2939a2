//! INIT negotiation as a pure function, plus the buffer sizes that follow.
//!
//! # Protocol rules (include/uapi/linux/fuse.h, libfuse `_do_init`)
//!
//! - Kernel major > 7: reply with only our major/minor (rest zero) and expect
//!   another INIT with a matching major ([`InitReply::Retry`]). Major < 7:
//!   reply EPROTO ([`InitReply::Refused`]).
//! - Same major: both sides use the smaller minor. The kernel takes our
//!   `minor` as is and only checks `minor < N` for compatibility, so we send
//!   ours, as libfuse does.
//! - Flag bits 32..63 travel in `flags2`, and only when FUSE_INIT_EXT is set
//!   (7.36+). Kernels before 7.36 send a 16-byte `fuse_init_in` without
//!   `flags2`; before 7.6, no flags at all.
//! - The reply is 8 bytes for kernels before 7.5, 24 before 7.23, else 64.
//!   A longer reply than the kernel's struct is rejected with EINVAL.
//! - The kernel clamps `max_pages` to `fs.fuse.max_pages_limit` and
//!   `max_write` to at least 4096; writes are split by both `max_write` and
//!   `max_pages * PAGE_SIZE`. We clamp the same way so that [`Negotiated`]
//!   tells the truth.
//! - FUSE_PASSTHROUGH needs `max_stack_depth` 1 or 2 in the reply, and no
//!   FUSE_WRITEBACK_CACHE; otherwise the kernel grants it in name only (every
//!   BACKING_OPEN then fails with EPERM). We send the depth with the flag; a file
//!   system that wants the writeback cache does not ask for passthrough.

use crate::abi::*;
use crate::errno::Errno;
use crate::reply::Reply;
use core::fmt;
use core::mem::size_of;
use zerocopy::{FromZeros, IntoBytes};

/// WRITE payload bytes that fit in the recommended in-place head.
pub const IN_PLACE_WRITE_BYTES: usize = 4096;
/// Recommended in-place head: header + `fuse_write_in` + 4 KiB of payload.
/// Holds every request but large WRITEs and SETXATTR values, which may
/// continue in the tail, and SYMLINKs with long targets, which may not: a file
/// system that serves SYMLINK sizes its head with
/// [`LARGEST_HEAD_ONLY_REQUEST`].
pub const RECOMMENDED_HEAD_SIZE: usize =
    size_of::<fuse_in_header>() + size_of::<fuse_write_in>() + IN_PLACE_WRITE_BYTES;
/// The largest request that must fit in the head, without extensions: a SYMLINK
/// with a name of [`FUSE_NAME_MAX`] and a target of `PATH_MAX` (4096, NUL
/// included). Extensions (FUSE_SECURITY_CTX, FUSE_CREATE_SUPP_GROUP) may add
/// to it, and may continue in the tail.
pub const LARGEST_HEAD_ONLY_REQUEST: usize =
    size_of::<fuse_in_header>() + FUSE_NAME_MAX + 1 + libc::PATH_MAX as usize;
/// Sysctl bounding `max_pages` (Linux 6.13+; 256 when absent).
pub const MAX_PAGES_LIMIT_PATH: &str = "/proc/sys/fs/fuse/max_pages_limit";
/// The kernel's default `max_pages_limit`, and its fixed limit before 6.13.
pub const DEFAULT_MAX_PAGES_LIMIT: u32 = 256;
/// `max_pages` the kernel uses when FUSE_MAX_PAGES is not negotiated.
const DEFAULT_MAX_PAGES_PER_REQ: u32 = 32;
/// The kernel raises any smaller `max_write` to this.
const MIN_MAX_WRITE: u32 = 4096;

/// Flags every file system asks for by default:
/// parallel reads (ASYNC_READ), large writes (BIG_WRITES + MAX_PAGES),
/// parallel lookups (PARALLEL_DIROPS), and several requests in flight per
/// O_DIRECT call (ASYNC_DIO). No locks, no caching modes, no splice. A file
/// system adds its own wishes (`FileSystem::init_config`), e.g.
/// DIRECT_IO_ALLOW_MMAP (7.39+), with which the kernel allows shared
/// mappings of a `FOPEN_DIRECT_IO` file, writes dirty mapped pages back before
/// each direct read or write and drops them after a direct write.
pub const DEFAULT_FLAGS: u64 =
    FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_PARALLEL_DIROPS | FUSE_ASYNC_DIO;

/// Smallest buffer a read of /dev/fuse may offer (kernel `fuse_dev_do_read`):
/// `max(FUSE_MIN_READ_BUFFER, sizeof(in_header) + sizeof(write_in) + max_write)`.
pub const fn min_read_buffer(max_write: u32) -> usize {
    let need = size_of::<fuse_in_header>() + size_of::<fuse_write_in>() + max_write as usize;
    if need > FUSE_MIN_READ_BUFFER {
        need
    } else {
        FUSE_MIN_READ_BUFFER
    }
}

/// Spill-over (tail) size that, with a head of `head` bytes, makes up
/// [`min_read_buffer`]. Before INIT, use `max_write` = 0 (8 KiB total).
pub const fn tail_size(head: usize, max_write: u32) -> usize {
    min_read_buffer(max_write).saturating_sub(head)
}

/// Our side of the negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitConfig {
    /// Largest WRITE wanted (default 1 MiB), clamped by `max_pages_limit`.
    pub max_write: u32,
    /// Readahead bound; the smaller of this and the kernel's wins.
    pub max_readahead: u32,
    /// Background request limit (async reads, async DIO); 0 keeps the kernel's.
    pub max_background: u16,
    /// Congestion threshold; 0 keeps the kernel's.
    pub congestion_threshold: u16,
    /// INIT flags wanted; only those the kernel offers are granted.
    pub flags: u64,
    /// Ask for FUSE_OVER_IO_URING (granted only if the kernel offers it).
    pub io_uring: bool,
    /// Upper bound for `max_pages` (`fs.fuse.max_pages_limit`).
    pub max_pages_limit: u32,
    /// Page size in bytes (unit of `max_pages`).
    pub page_size: u32,
    /// `max_stack_depth` sent when FUSE_PASSTHROUGH is granted (1 or 2; the kernel
    /// turns passthrough off silently for anything else).
    pub max_stack_depth: u32,
}

impl InitConfig {
    /// Defaults that need no system access: 1 MiB writes, [`DEFAULT_FLAGS`],
    /// 4 KiB pages, a `max_pages_limit` of 256.
    pub const fn new() -> InitConfig {
        InitConfig {
            max_write: 1 << 20,
            max_readahead: u32::MAX,
            max_background: 0,
            congestion_threshold: 0,
            flags: DEFAULT_FLAGS,
            io_uring: false,
            max_pages_limit: DEFAULT_MAX_PAGES_LIMIT,
            page_size: 4096,
            max_stack_depth: FUSE_BACKING_STACKED_UNDER,
        }
    }

    /// Reads `max_pages_limit` from /proc (if readable) and the page size.
    pub fn with_system_limits(mut self) -> InitConfig {
        self.max_pages_limit = read_max_pages_limit().unwrap_or(DEFAULT_MAX_PAGES_LIMIT);
        self.page_size = u32::try_from(crate::dev::page_size()).unwrap_or(4096);
        self
    }
}

impl Default for InitConfig {
    fn default() -> InitConfig {
        InitConfig::new()
    }
}

/// `fs.fuse.max_pages_limit`, if the kernel has it and it parses.
pub fn read_max_pages_limit() -> Option<u32> {
    std::fs::read_to_string(MAX_PAGES_LIMIT_PATH)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What was agreed, for the server loop and for one log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Protocol major (7).
    pub major: u32,
    /// Minor in effect: the smaller of ours and the kernel's.
    pub minor: u32,
    /// Minor the kernel sent.
    pub kernel_minor: u32,
    /// Largest WRITE payload the kernel will send.
    pub max_write: u32,
    /// `max_pages` granted (0 without FUSE_MAX_PAGES).
    pub max_pages: u16,
    /// Readahead in bytes.
    pub max_readahead: u32,
    /// Flags granted (a subset of `offered`), FUSE_INIT_EXT included.
    pub flags: u64,
    /// Flags the kernel offered.
    pub offered: u64,
}

impl Negotiated {
    /// True if every bit of `flag` was granted.
    pub fn has(&self, flag: u64) -> bool {
        self.flags & flag == flag
    }

    /// What the granted flags change in request layouts, for [`Request::decode_with`](crate::Request::decode_with).
    pub fn features(&self) -> crate::decode::Features {
        crate::decode::Features::from_flags(self.flags)
    }

    /// Minimum total buffer for every read from now on.
    pub fn read_buffer_size(&self) -> usize {
        min_read_buffer(self.max_write)
    }
}

/// The answer to one INIT request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitReply {
    /// Send the first `len` bytes of `out`: the session is up.
    Accepted {
        /// The reply struct.
        out: fuse_init_out,
        /// Bytes of `out` the kernel's ABI minor expects.
        len: usize,
        /// Summary of the agreement.
        negotiated: Negotiated,
    },
    /// Kernel major > 7: send our version only and wait for another INIT.
    Retry {
        /// Major and minor set, the rest zero.
        out: fuse_init_out,
    },
    /// Kernel major < 7: reply with this error and stop.
    Refused(Errno),
}

impl InitReply {
    /// The reply to write for INIT request `unique`.
    pub fn reply(&self, unique: u64) -> Reply<'_> {
        match self {
            InitReply::Accepted { out, len, .. } => Reply::data(unique, &out.as_bytes()[..*len]),
            InitReply::Retry { out } => Reply::arg(unique, out),
            InitReply::Refused(errno) => Reply::error(unique, *errno),
        }
    }
}

/// Negotiates INIT: the kernel's offer against our wishes.
pub fn negotiate(kernel: &fuse_init_in, config: &InitConfig) -> InitReply {
    use core::cmp::Ordering;
    match kernel.major.cmp(&FUSE_KERNEL_VERSION) {
        Ordering::Less => InitReply::Refused(Errno::EPROTO),
        Ordering::Greater => InitReply::Retry {
            out: version_only(),
        },
        Ordering::Equal => accept(kernel, config),
    }
}

fn version_only() -> fuse_init_out {
    let mut out = fuse_init_out::new_zeroed();
    out.major = FUSE_KERNEL_VERSION;
    out.minor = FUSE_KERNEL_MINOR_VERSION;
    out
}

/// All flags of a `fuse_init_in`, `flags2` only if FUSE_INIT_EXT says so.
pub fn offered_flags(kernel: &fuse_init_in) -> u64 {
    let low = if kernel.minor < 6 {
        0
    } else {
        u64::from(kernel.flags)
    };
    match low & FUSE_INIT_EXT {
        0 => low,
        _ => low | u64::from(kernel.flags2) << 32,
    }
}

/// Flags wished for and offered, plus FUSE_INIT_EXT (to carry `flags2`)
/// whenever the kernel sent it, as libfuse does.
fn granted_flags(offered: u64, config: &InitConfig) -> u64 {
    let io_uring = if config.io_uring {
        FUSE_OVER_IO_URING
    } else {
        0
    };
    ((config.flags | io_uring) & offered) | (offered & FUSE_INIT_EXT)
}

/// `max_write` and `max_pages` after the kernel's clamps; `max_pages` is 0
/// when FUSE_MAX_PAGES is not granted (the kernel then uses 32 pages).
fn write_limits(config: &InitConfig, max_pages_granted: bool) -> (u32, u16) {
    let page = config.page_size.max(1);
    let pages = match max_pages_granted {
        true => config.max_pages_limit.clamp(1, u32::from(u16::MAX)),
        false => DEFAULT_MAX_PAGES_PER_REQ,
    };
    let max_write = config
        .max_write
        .min(pages.saturating_mul(page))
        .max(MIN_MAX_WRITE);
    let max_pages = match max_pages_granted {
        true => max_write.div_ceil(page).min(pages),
        false => 0,
    };
    (max_write, u16::try_from(max_pages).unwrap_or(u16::MAX))
}

/// Size of `fuse_init_out` a kernel of minor `minor` reads.
fn init_out_len(minor: u32) -> usize {
    match minor {
        0..=4 => FUSE_COMPAT_INIT_OUT_SIZE,
        5..=22 => FUSE_COMPAT_22_INIT_OUT_SIZE,
        _ => size_of::<fuse_init_out>(),
    }
}

fn accept(kernel: &fuse_init_in, config: &InitConfig) -> InitReply {
    let offered = offered_flags(kernel);
    let flags = granted_flags(offered, config);
    let (max_write, max_pages) = write_limits(config, flags & FUSE_MAX_PAGES != 0);
    let negotiated = Negotiated {
        major: FUSE_KERNEL_VERSION,
        minor: kernel.minor.min(FUSE_KERNEL_MINOR_VERSION),
        kernel_minor: kernel.minor,
        max_write,
        max_pages,
        max_readahead: kernel.max_readahead.min(config.max_readahead),
        flags,
        offered,
    };
    let out = init_out(&negotiated, config);
    let len = init_out_len(kernel.minor);
    InitReply::Accepted {
        out,
        len,
        negotiated,
    }
}

fn init_out(n: &Negotiated, config: &InitConfig) -> fuse_init_out {
    let mut out = version_only();
    out.max_readahead = n.max_readahead;
    out.flags = n.flags as u32;
    out.flags2 = (n.flags >> 32) as u32;
    out.max_background = config.max_background;
    out.congestion_threshold = config.congestion_threshold.min(config.max_background);
    out.max_write = n.max_write;
    out.time_gran = 1;
    out.max_pages = n.max_pages;
    if n.flags & FUSE_PASSTHROUGH != 0 {
        out.max_stack_depth = config.max_stack_depth;
    }
    out
}

impl fmt::Display for Negotiated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FUSE {}.{} (kernel 7.{}): max_write={} max_pages={} max_readahead={} read_buffer={} flags={}",
            self.major,
            self.minor,
            self.kernel_minor,
            self.max_write,
            self.max_pages,
            self.max_readahead,
            self.read_buffer_size(),
            crate::flags::FlagNames(self.flags),
        )
    }
}

#[cfg(test)]
#[path = "init_tests.rs"]
mod tests;
