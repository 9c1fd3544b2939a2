#!/usr/bin/env bash
# Usage: benches/perf/profile-export.sh [--dispatch MODE] [--image null:1G|PATH]
#            [--workload randread|randwrite] [--iodepth N] [--seconds S]
#            [--mount-opt "OPTS"] OUT_DIR
#
# Profiles the export daemon under load. Mounts IMAGE with `corofuse mount --stats` (the
# release binary; --dispatch coroutine|inline|threads:N) on a temporary mount point,
# drives it with `corofuse bench load` (4 KiB, O_DIRECT; psync at iodepth 1, io_uring
# above), and over exactly the load's duration records the DAEMON with
# `perf record -g --call-graph fp` and counts it with `perf stat`. Writes to OUT_DIR:
#   flame.svg      inferno flame graph (perf script | inferno-collapse-perf | inferno-flamegraph)
#   stacks.folded  the collapsed stacks behind it (grep them)
#   report.txt     perf report --stdio --no-children, top entries, flat then with callers
#   summary.txt    requests, CPU and context switches per request, coroutine switches,
#                  io_uring_enter and syscalls per request, where the CPU time goes
#   perf.data, perf-stat.csv, stats-{before,after}.json, daemon.log, load.json
# See PROFILING.md, "Profiling the export".
set -euo pipefail

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
dispatch=coroutine image=null:1G workload=randread iodepth=1 seconds=5 mount_opts=""
while [[ $# -gt 0 ]]; do
    case $1 in
    --dispatch | --image | --workload | --iodepth | --seconds | --mount-opt)
        [[ $# -ge 2 ]] || usage
        case $1 in
        --dispatch) dispatch=$2 ;;
        --image) image=$2 ;;
        --workload) workload=$2 ;;
        --iodepth) iodepth=$2 ;;
        --seconds) seconds=$2 ;;
        --mount-opt) mount_opts+=" $2" ;;
        esac
        shift 2
        ;;
    -*) usage ;;
    *) break ;;
    esac
done
[[ $# -eq 1 && $workload =~ ^rand(read|write)$ && $iodepth =~ ^[1-9][0-9]*$ ]] || usage
out=$(realpath -m "$1")
engine=psync
[[ $iodepth -gt 1 ]] && engine=io_uring
export PATH=$HOME/.cargo/bin:$PATH
for tool in perf jq inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "$tool missing (inferno: cargo install inferno)" >&2; exit 1; }
done

cd "$(dirname "$0")/../.."
cargo build --release -p corofuse
bin=$PWD/target/release/corofuse
mkdir -p "$out"
rm -f "$out"/{flame.svg,stacks.folded,report.txt,summary.txt,perf.data,perf-stat.csv,stats-before.json,stats-after.json,daemon.log,load.json}
tmp=$(mktemp -d /tmp/corofuse-profile.XXXXXX)
mnt=$tmp/mnt
touch "$mnt"
daemon="" perfs=()

mounted() { awk -v m="$mnt" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }
cleanup() {
    local status=$? p i
    for p in "${perfs[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${perfs[@]}"; do wait "$p" 2>/dev/null || true; done
    if [[ -n $daemon ]] && kill -TERM "$daemon" 2>/dev/null; then
        for i in $(seq 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$daemon" 2>/dev/null && echo "daemon $daemon ignored SIGTERM: killed" >&2
        wait "$daemon" 2>/dev/null || true
    fi
    if mounted; then
        echo "$mnt still mounted: umount -l" >&2
        umount -l "$mnt" || true
    fi
    [[ -f $tmp/log ]] && cp "$tmp/log" "$out/daemon.log"
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The daemon, until it has written its pidfile and the kernel lists the mount.
rw=()
[[ $workload == randwrite ]] && rw=(-w)
# shellcheck disable=SC2086 # --mount-opt is word-split on purpose
"$bin" mount "${rw[@]}" --dispatch "$dispatch" --stats "$tmp/stats.json" --pidfile "$tmp/pid" \
    $mount_opts "$image" "$mnt" 2>"$tmp/log" &
daemon=$!
for i in $(seq 200); do
    [[ -s $tmp/pid ]] && mounted && break
    kill -0 "$daemon" 2>/dev/null || { cat "$tmp/log" >&2; daemon=""; exit 1; }
    [[ $i -eq 200 ]] && { echo "no mount after 20 s" >&2; cat "$tmp/log" >&2; exit 1; }
    sleep 0.1
done

# SIGUSR1 makes the daemon rewrite its --stats file; wait until it parses.
snapshot() {
    rm -f "$tmp/stats.json"
    kill -USR1 "$daemon"
    for i in $(seq 500); do
        jq -e .queue.requests "$tmp/stats.json" >/dev/null 2>&1 && { cp "$tmp/stats.json" "$1"; return; }
        sleep 0.01
    done
    echo "no --stats after SIGUSR1" >&2
    exit 1
}
cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$daemon/stat"; }

# perf record and perf stat attach now but start disabled (-D -1): the window opens and
# closes through their control fifos, around the load and nothing else.
events=task-clock,context-switches,cpu-migrations
tp=raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_writev,syscalls:sys_enter_read
perf stat -e "$tp" -- true >/dev/null 2>&1 && events+=,$tp
mkfifo "$tmp"/{rec,stat}.{ctl,ack}
perf record -g --call-graph fp -p "$daemon" -o "$out/perf.data" -D -1 \
    --control "fifo:$tmp/rec.ctl,$tmp/rec.ack" 2>"$tmp/record.log" &
perfs+=($!)
perf stat -e "$events" -x, -o "$out/perf-stat.csv" -p "$daemon" -D -1 \
    --control "fifo:$tmp/stat.ctl,$tmp/stat.ack" 2>/dev/null &
perfs+=($!)
exec 3>"$tmp/rec.ctl" 4<"$tmp/rec.ack" 5>"$tmp/stat.ctl" 6<"$tmp/stat.ack"
control() { # enable|disable, both perfs, waiting for their acks
    local ack
    echo "$1" >&3 && read -r -t 20 ack <&4
    echo "$1" >&5 && read -r -t 20 ack <&6
}

snapshot "$out/stats-before.json"
cpu0=$(cpu_ticks)
control enable
"$bin" bench load --file "$mnt" --rw "$workload" --engine "$engine" --iodepth "$iodepth" \
    --seconds "$seconds" >"$out/load.json"
control disable
cpu1=$(cpu_ticks)
snapshot "$out/stats-after.json"
for p in "${perfs[@]}"; do kill -INT "$p"; done
for p in "${perfs[@]}"; do wait "$p" || true; done
perfs=()
exec 3>&- 4<&- 5>&- 6<&-

# Stop the daemon now (cleanup would too) so that a failure to stop shows up here.
kill -TERM "$daemon"
wait "$daemon" || { echo "daemon exited with status $?" >&2; daemon=""; exit 1; }
daemon=""
mounted && { echo "$mnt still mounted after the daemon exited" >&2; exit 1; }

# Collapsed stacks (kernel frames marked _[k]) and report.
title="corofuse $dispatch, $image, $workload $engine iodepth $iodepth, ${seconds}s (daemon only)"
perf script -i "$out/perf.data" 2>/dev/null | inferno-collapse-perf --kernel >"$out/stacks.folded"
{
    echo "# $title"
    perf report -i "$out/perf.data" --stdio --no-children --sort dso,sym -g none \
        --percent-limit 0.5 2>/dev/null | grep -v '^$' | head -45
    echo
    echo "# with callers (-G), entries above 3%"
    perf report -i "$out/perf.data" --stdio --no-children --sort sym -G \
        --percent-limit 3 2>/dev/null | grep -v '^$' | grep -v '^#' | head -150
} >"$out/report.txt"

# Summary: counters per request over the window, then the profile split into kinds of work.
jq -rn --slurpfile b "$out/stats-before.json" --slurpfile a "$out/stats-after.json" \
    '[$a[0], $b[0]] | map([.queue.requests, .runtime.switches, .runtime.enter_calls,
     .runtime.sqes_submitted]) | transpose | map(.[0] - .[1]) | @tsv' >"$tmp/counts"
read -r requests switches enters sqes <"$tmp/counts"
tick_us=$((1000000 / $(getconf CLK_TCK)))
awk -F, -v r="$requests" -v s="$switches" -v e="$enters" -v q="$sqes" \
    -v cpu=$(((cpu1 - cpu0) * tick_us)) -v load="$(cat "$out/load.json")" -v title="$title" '
    function per(x) { return r > 0 ? x / r : 0 }
    $3 != "" { v[$3] = $1 }
    END {
        match(load, /"iops":[0-9.]+/); iops = substr(load, RSTART + 7, RLENGTH - 7)
        print "# " title
        printf "%-36s %12d\n", "requests (queue.requests)", r
        printf "%-36s %12.0f\n", "load IOPS (bench load)", iops
        printf "%-36s %12.1f ms\n", "daemon task-clock (perf stat)", v["task-clock"]
        printf "%-36s %12.1f ms\n", "daemon utime+stime (/proc)", cpu / 1000
        print "per request:"
        printf "  %-34s %12.2f\n", "CPU us (task-clock)", per(v["task-clock"] * 1000)
        printf "  %-34s %12.2f\n", "CPU us (utime+stime)", per(cpu)
        printf "  %-34s %12.3f\n", "context switches (perf stat)", per(v["context-switches"])
        printf "  %-34s %12.3f\n", "cpu migrations (perf stat)", per(v["cpu-migrations"])
        printf "  %-34s %12.3f\n", "coroutine switches (runtime)", per(s)
        printf "  %-34s %12.3f\n", "io_uring SQEs (runtime)", per(q)
        printf "  %-34s %12.3f\n", "io_uring_enter (runtime)", per(e)
        if ("raw_syscalls:sys_enter" in v) {
            printf "  %-34s %12.3f\n", "io_uring_enter (tracepoint)", per(v["syscalls:sys_enter_io_uring_enter"])
            printf "  %-34s %12.3f\n", "writev (tracepoint)", per(v["syscalls:sys_enter_writev"])
            printf "  %-34s %12.3f\n", "read (tracepoint)", per(v["syscalls:sys_enter_read"])
            printf "  %-34s %12.3f\n", "all syscalls (tracepoint)", per(v["raw_syscalls:sys_enter"])
        }
        printf "%.6f %.3f %.3f\n", per(v["task-clock"] * 1000), per(v["context-switches"]), per(s) >"/dev/stderr"
    }' "$out/perf-stat.csv" >"$out/summary.txt" 2>"$tmp/per"
read -r us cs co <"$tmp/per"

# Each sample goes to the first kind its stack matches, kernel rules before user ones.
{
    echo "where the daemon's CPU goes: share of perf samples, and share x CPU us/request"
    awk -v us="$us" '
        function kind(s) {
            if (s ~ /^iou-wrk/) return "kernel: io-wq worker threads (punted I/O)"
            if (s ~ /;(__)?schedule_\[k\]/) return "kernel: scheduler (sleep, preemption, switch)"
            if (s ~ /fuse_request_end|fuse_aio_complete/) return "kernel: FUSE request end (wakes the client)"
            if (s ~ /fuse_copy_/) return "kernel: FUSE copy (pin pages, memcpy)"
            if (s ~ /fuse_dev_(do_)?write/) return "kernel: FUSE reply write, other"
            if (s ~ /fuse_dev_(do_)?read|fuse_dev_poll/) return "kernel: FUSE request read, other"
            if (s ~ /shmem_file_|filemap_|generic_perform_write|_copy_(to|from)_iter|copy_page_(to|from)_iter/) return "kernel: image I/O (page cache, tmpfs)"
            if (s ~ /perf_syscall_|perf_trace_|perf_tp_event|syscall_trace_enter/) return "kernel: perf syscall tracepoints (overhead)"
            if (s ~ /io_uring_enter/) return "kernel: io_uring_enter, other"
            if (s ~ /sys_writev|do_writev/) return "kernel: writev, other"
            if (s ~ /exc_page_fault/) return "kernel: page faults"
            if (s ~ /_\[k\]$/) return "kernel: syscall entry/exit, interrupts, other"
            if (s ~ /clock_gettime|Instant>::(now|elapsed)|Timespec|Accounting::record|Queue::account/) return "user: clocks and --stats accounting"
            if (s ~ /stack_init_trampoline/) return "user: request coroutines, other"
            return "user: loop or worker threads, outside coroutines"
        }
        { n = $NF; sub(/ [0-9]+$/, ""); total += n; by[kind($0)] += n }
        END {
            for (k in by)
                printf "%7.1f%%  %6.2f us  %s\n", 100 * by[k] / total, us * by[k] / total, k | "sort -rn"
        }' "$out/stacks.folded"
} >>"$out/summary.txt"
cat "$out/summary.txt"

# Kernel frames orange, Rust (names with ::) yellow, libc and the rest red.
inferno-flamegraph --colors java --countname "ns of CPU" --title "$title" \
    --subtitle "$(printf 'per request: %.2f us CPU, %.2f context switches, %.2f coroutine switches' "$us" "$cs" "$co")" \
    <"$out/stacks.folded" >"$out/flame.svg" 2>/dev/null
echo "flame graph: $out/flame.svg; report: $out/report.txt"
