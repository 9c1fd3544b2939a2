//! Tunables of one event loop: coroutine stack size and pool bound, ring size.

/// Default coroutine stack size: 256 KiB plus one guard page.
///
/// Why this is enough: a FUSE request path (decode, backend call, io_uring op, reply) uses a
/// few KiB; the deepest paths we run are `log` formatting and panic unwinding with the
/// standard panic hook, which stay under 64 KiB (the runtime's tests run a panic with a
/// backtrace and a coroutine that uses 200 KiB of a 256 KiB stack). Only touched pages cost
/// memory: an untouched stack is address space, not RAM, so 10,000 live coroutines at this
/// size reserve 2.5 GiB of address space but only a few pages each of memory.
pub const DEFAULT_STACK_SIZE: usize = 256 * 1024;

/// Configuration of a [`Runtime`](crate::Runtime).
#[derive(Clone, Debug)]
pub struct Config {
    /// Usable bytes of each coroutine stack (a guard page is added below it).
    pub stack_size: usize,
    /// At most this many finished stacks are kept for reuse; beyond it they are unmapped.
    pub max_free_stacks: usize,
    /// Submission queue entries of the ring (the completion queue is twice as large).
    pub ring_entries: u32,
    /// Use 128-byte SQEs (needed by `IORING_OP_URING_CMD`, e.g. FUSE over io_uring).
    pub sqe128: bool,
    /// Before sleeping for a completion, spin up to this long watching the completion
    /// queue (0: never spin). The window adapts between 0 and this maximum to how long
    /// the loop really waits, as QEMU's `poll-max-ns` does.
    pub poll_ns: u64,
    /// Time each coroutine's I/O waits and each reap of completions (two clock reads per
    /// I/O, one per reap), for per-request accounting ([`Co::stats`](crate::Co::stats)).
    pub account: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stack_size: DEFAULT_STACK_SIZE,
            max_free_stacks: 1024,
            ring_entries: 256,
            sqe128: false,
            poll_ns: 0,
            account: false,
        }
    }
}
