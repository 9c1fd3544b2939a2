# Usage: awk [-v us=CPU_US_PER_REQUEST] -f benches/perf/kinds.awk STACKS.folded
#
# Splits a profile of the export daemon two ways: by kind of work (each stack goes to the
# first kind it matches, kernel rules before user ones) and by the system call it is in
# (inclusive: the kernel's work, the preemption at its return, the libc wrapper). Input:
# collapsed stacks from `perf script | inferno-collapse-perf --kernel` (kernel frames end
# in `_[k]`; the first field is the thread's name). Prints each part's share of the
# samples and, given the daemon's CPU time per request (us), that share in microseconds
# per request. Used by profile-export.sh; see PROFILING.md, "Profiling the export".
function kind(s) {
    if (s ~ /^iou-wrk/) return "kernel: io-wq worker threads (punted I/O)"
    if (s ~ /;(__)?schedule_\[k\]/) return "kernel: scheduler (sleep, preemption, switch)"
    if (s ~ /fuse_request_end|fuse_aio_complete/) return "kernel: FUSE request end (wakes the client)"
    if (s ~ /fuse_copy_/) return "kernel: FUSE copy (pin pages, memcpy)"
    if (s ~ /fuse_dev_(do_)?write/) return "kernel: FUSE reply write, other"
    if (s ~ /fuse_dev_(do_)?read|fuse_dev_poll/) return "kernel: FUSE request read, other"
    if (s ~ /shmem_file_|filemap_|generic_perform_write|_copy_(to|from)_iter|copy_page_(to|from)_iter/)
        return "kernel: image I/O (page cache, tmpfs)"
    if (s ~ /perf_syscall_|perf_trace_|perf_tp_event|syscall_trace_enter/)
        return "kernel: perf syscall tracepoints (--syscalls)"
    if (s ~ /io_uring_enter/) return "kernel: io_uring_enter, other"
    if (s ~ /sys_writev|do_writev/) return "kernel: writev, other"
    if (s ~ /exc_page_fault/) return "kernel: page faults"
    # Before the catch-all: the vDSO is marked _[k] too, but clock reads stay in user space.
    if (s ~ /clock_gettime|Instant>::(now|elapsed)|Timespec|Accounting::record|Queue::account/)
        return "user: clock reads (mostly --stats accounting)"
    if (s ~ /_\[k\]$/) return "kernel: syscall entry/exit, interrupts, other"
    if (s ~ /stack_init_trampoline/) return "user: on a coroutine stack, other"
    return "user: on a thread stack (loop, worker threads)"
}
function syscall(s) {
    if (s ~ /^iou-wrk/) return "io-wq worker threads"
    if (s ~ /__GI___writev|do_writev/) return "writev (replies)"
    if (s ~ /io_uring_enter/) return "io_uring_enter"
    if (s ~ /__GI___readv|do_readv/) return "readv (/dev/fuse)"
    if (s ~ /preadv|pwritev|pread64|pwrite64/) return "preadv/pwritev (image)"
    if (s ~ /entry_SYSCALL/) return "other system calls"
    return "none (user code, page faults, interrupts)"
}
function show(title, by, k) {
    print title
    for (k in by)
        if (total > 0 && by[k] >= total / 2000) # 0.05%
            printf "%7.1f%%  %6.2f us  %s\n", 100 * by[k] / total, us * by[k] / total, k | "sort -rn"
    close("sort -rn")
}
{ n = $NF; sub(/ [0-9]+$/, ""); total += n; kinds[kind($0)] += n; calls[syscall($0)] += n }
END {
    show("where the daemon's CPU goes: share of perf samples, and share x CPU us/request", kinds)
    show("the same by system call, inclusive", calls)
}
