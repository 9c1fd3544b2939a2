#!/usr/bin/env bash
# Usage: benches/perf/profile-export.sh [--dispatch MODE] [--image null:1G|PATH]
#            [--workload randread|randwrite] [--iodepth N] [--seconds S]
#            [--mount-opt "OPTS"] [--syscalls] OUT_DIR
#
# Profiles the export daemon under load. Mounts IMAGE with `corofuse mount --stats` (the
# release binary; --dispatch coroutine|inline|threads:N) on a temporary mount point,
# drives it with `corofuse-lab bench load` (4 KiB, O_DIRECT; psync at iodepth 1, io_uring
# above), and over exactly the load's duration samples with `perf record -a -g
# --call-graph fp`, keeping the DAEMON's samples, and counts the daemon with `perf stat`
# (--syscalls: also its system calls, with tracepoints that cost it ~0.5 us per request).
# Writes to OUT_DIR:
#   flame.svg      inferno flame graph (perf script | inferno-collapse-perf | inferno-flamegraph)
#   stacks.folded  the collapsed stacks behind it (grep them)
#   report.txt     perf report --stdio --no-children, top entries, flat then with callers
#   summary.txt    per request: CPU, context switches, coroutine switches, SQEs,
#                  io_uring_enter; where the CPU goes, by kind of work and by syscall
#   perf.data, perf-stat.csv, stats-{before,after}.json, daemon.log, load.json
# See PROFILING.md, "Profiling the export".
set -euo pipefail

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
dispatch=coroutine image=null:1G workload=randread iodepth=1 seconds=5 mount_opts="" syscalls=0
while [[ $# -gt 0 ]]; do
    case $1 in
    --syscalls) syscalls=1 && shift ;;
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
[[ $# -eq 1 && $workload =~ ^rand(read|write)$ && $iodepth =~ ^[1-9][0-9]*$ && $seconds =~ ^[1-9][0-9]*$ ]] ||
    usage
out=$(realpath -m "$1")
engine=psync
[[ $iodepth -gt 1 ]] && engine=io_uring
[[ $EUID -eq 0 ]] || { echo "needs root (corofuse mount, perf record -a)" >&2; exit 1; }
export PATH=$HOME/.cargo/bin:$PATH
for tool in perf jq inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "$tool missing (inferno: cargo install inferno)" >&2; exit 1; }
done

cd "$(dirname "$0")/../.."
cargo build --release -p corofuse -p corofuse-lab
bin=$PWD/target/release/corofuse
mkdir -p "$out"
rm -f "$out"/{flame.svg,stacks.folded,report.txt,summary.txt,perf.data,perf-stat.csv,stats-before.json,stats-after.json,daemon.log,load.json}
tmp=$(mktemp -d /tmp/corofuse-profile.XXXXXX)
mnt=$tmp/mnt
touch "$mnt"
daemon="" load="" perfs=()

mounted() { awk -v m="$mnt" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }
cleanup() {
    local status=$? p i
    [[ -n $load ]] && kill -TERM "$load" 2>/dev/null
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
trap 'echo "$0: interrupted" >&2; exit 130' INT TERM
trap 'echo "$0: line $LINENO: status $?" >&2' ERR

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

# perf record and perf stat start now but disabled (-D -1): the window opens and closes
# through their control fifos, around the load and nothing else. perf record samples the
# whole machine (-a, per-CPU timers) and the daemon's samples are picked out afterwards:
# sampling the daemon's own threads (-p) arms and disarms a timer at each of its context
# switches, which on this VM doubles its CPU per request (PROFILING.md). Counting (perf
# stat -p) costs it next to nothing.
events=task-clock,context-switches,cpu-migrations
tp=raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_writev
tp+=,syscalls:sys_enter_read,syscalls:sys_enter_readv
[[ $syscalls == 1 ]] && events+=,$tp
mkfifo "$tmp"/{rec,stat}.{ctl,ack}
perf record -a -g --call-graph fp -o "$out/perf.data" -D -1 \
    --control "fifo:$tmp/rec.ctl,$tmp/rec.ack" 2>"$tmp/record.log" &
perfs+=($!)
perf stat -e "$events" -x, -o "$out/perf-stat.csv" -p "$daemon" -D -1 \
    --control "fifo:$tmp/stat.ctl,$tmp/stat.ack" 2>/dev/null &
perfs+=($!)
# Read-write opens of a fifo never block, so a perf that died early cannot hang us here.
exec 3<>"$tmp/rec.ctl" 4<>"$tmp/rec.ack" 5<>"$tmp/stat.ctl" 6<>"$tmp/stat.ack"
control() { # enable|disable, both perfs, waiting for their acks
    { echo "$1" >&3 && read -r -t 20 _ <&4 && echo "$1" >&5 && read -r -t 20 _ <&6; } ||
        { echo "perf did not $1:" >&2; cat "$tmp/record.log" >&2; return 1; }
}

snapshot "$out/stats-before.json"
cpu0=$(cpu_ticks)
control enable
"$bin-lab" bench load --file "$mnt" --rw "$workload" --engine "$engine" --iodepth "$iodepth" \
    --seconds "$seconds" >"$out/load.json" &
load=$! # waited for in the background, so that a signal to this script acts at once
wait "$load"
load=""
control disable
cpu1=$(cpu_ticks)
snapshot "$out/stats-after.json"
for p in "${perfs[@]}"; do kill -INT "$p"; done
for p in "${perfs[@]}"; do wait "$p" || true; done
perfs=()
exec 3>&- 4<&- 5>&- 6<&-

# Stop the daemon now (cleanup would too) so that a failure to stop shows up here.
pid=$daemon
kill -TERM "$daemon"
wait "$daemon" || { echo "daemon exited with status $?" >&2; daemon=""; exit 1; }
daemon=""
mounted && { echo "$mnt still mounted after the daemon exited" >&2; exit 1; }

# Collapsed stacks (kernel frames marked _[k]) and report.
title="corofuse $dispatch, $image, $workload $engine iodepth $iodepth, ${seconds}s (daemon only)"
perf script -i "$out/perf.data" --pid "$pid" 2>/dev/null | inferno-collapse-perf --kernel >"$out/stacks.folded"
{
    # The pid sort key keeps entries per thread: perf report --pid drops a merged entry
    # whenever its first sample came from another process.
    report=(perf report -i "$out/perf.data" --pid "$pid" --stdio --no-children --percentage relative)
    echo "# $title"
    "${report[@]}" --sort pid,dso,sym -g none --percent-limit 0.5 2>/dev/null |
        awk 'NF && n++ < 45'
    echo
    echo "# entries above 3%, with their callers (branch percentages relative to the entry)"
    "${report[@]}" --sort pid,sym -g fractal,5,caller --percent-limit 3 2>/dev/null |
        awk 'NF && !/^#/ && n++ < 150'
} >"$out/report.txt"

# Summary: counters per request over the window, then the profile split into kinds of work.
jq -rn --slurpfile b "$out/stats-before.json" --slurpfile a "$out/stats-after.json" \
    '[$a[0], $b[0]] | map([.queue.requests, .runtime.switches, .runtime.enter_calls,
     .runtime.sqes_submitted]) | transpose | map(.[0] - .[1]) | @tsv' >"$tmp/counts"
read -r requests switches enters sqes <"$tmp/counts"
tick_us=$((1000000 / $(getconf CLK_TCK)))
awk -F, -v pid="$pid" -v r="$requests" -v s="$switches" -v e="$enters" -v q="$sqes" \
    -v cpu=$(((cpu1 - cpu0) * tick_us)) -v load="$(cat "$out/load.json")" -v title="$title" \
    -v loop="$([[ $dispatch == threads:* ]] && echo 0 || echo 1)" '
    function per(x) { return r > 0 ? x / r : 0 }
    function rt(name, x) { # runtime counters: the threads dispatch has no loop
        if (loop) printf "  %-34s %12.3f\n", name, per(x)
        else printf "  %-34s %12s\n", name, "n/a"
    }
    $3 != "" { v[$3] = $1 }
    END {
        match(load, /"iops":[0-9.]+/); iops = substr(load, RSTART + 7, RLENGTH - 7)
        print "# " title
        printf "%-36s %12d\n", "daemon pid (for perf report --pid)", pid
        printf "%-36s %12d\n", "requests (queue.requests)", r
        printf "%-36s %12.0f\n", "load IOPS (bench load)", iops
        printf "%-36s %12.1f ms\n", "daemon utime+stime (/proc)", cpu / 1000
        printf "%-36s %12.1f ms\n", "daemon task-clock (perf stat)", v["task-clock"]
        print "per request:"
        printf "  %-34s %12.2f\n", "CPU us (utime+stime)", per(cpu)
        printf "  %-34s %12.2f\n", "CPU us (task-clock)", per(v["task-clock"] * 1000)
        printf "  %-34s %12.3f\n", "context switches (perf stat)", per(v["context-switches"])
        printf "  %-34s %12.3f\n", "cpu migrations (perf stat)", per(v["cpu-migrations"])
        rt("coroutine switches (runtime)", s)
        rt("io_uring SQEs (runtime)", q)
        rt("io_uring_enter (runtime)", e)
        if ("raw_syscalls:sys_enter" in v) {
            printf "  %-34s %12.3f\n", "io_uring_enter (tracepoint)", per(v["syscalls:sys_enter_io_uring_enter"])
            printf "  %-34s %12.3f\n", "writev (tracepoint)", per(v["syscalls:sys_enter_writev"])
            printf "  %-34s %12.3f\n", "read + readv (tracepoint)",
                per(v["syscalls:sys_enter_read"] + v["syscalls:sys_enter_readv"])
            printf "  %-34s %12.3f\n", "all syscalls (tracepoint)", per(v["raw_syscalls:sys_enter"])
        }
        printf "%.6f %.2f %s\n", per(cpu), per(v["context-switches"]),
            loop ? sprintf("%.2f", per(s)) : "n/a" >"/dev/stderr"
    }' "$out/perf-stat.csv" >"$out/summary.txt" 2>"$tmp/per"
read -r us cs co <"$tmp/per"

{
    # Frame-pointer unwinding crosses from a coroutine's stack into the loop that resumed it.
    awk '{ n = $NF; all += n } /stack_init_trampoline/ { co += n; if (/Inner::run_task;/) up += n }
        END { printf "samples on a coroutine stack: %.1f%%, of which %.1f%% unwind into Inner::run_task\n",
                     all ? 100 * co / all : 0, co ? 100 * up / co : 0 }' "$out/stacks.folded"
    awk -v us="$us" -f benches/perf/kinds.awk "$out/stacks.folded"
} >>"$out/summary.txt"
cat "$out/summary.txt"

# Kernel frames orange, Rust (names with ::) yellow, libc and the rest red.
inferno-flamegraph --colors java --countname "ns of CPU" --title "$title" \
    --subtitle "$(printf 'per request: %.2f us CPU, %s context switches, %s coroutine switches' "$us" "$cs" "$co")" \
    <"$out/stacks.folded" >"$out/flame.svg" 2>/dev/null
echo "flame graph: $out/flame.svg; report: $out/report.txt"
