#!/bin/bash
# Usage: benches/perf/load-cell.sh BIN IMAGE ENGINE IODEPTH RW   (as root)
# One cell of a before/after comparison of two corofuse binaries on the same machine:
# mounts IMAGE with BIN (default dispatch; writable for write loads), runs the lab's
# `bench load` (BIN-lab, beside it: corofuse-lab) for 5 s (4 KiB, O_DIRECT), and prints one line: the binary, the cell, IOPS
# and the daemon's CPU (utime+stime) per operation. Interleave the binaries yourself, e.g.
#   for order in "A B" "B A"; do for b in $order; do load-cell.sh ./corofuse-$b null:1G io_uring 64 randread; done; done
set -euo pipefail
bin=$1; img=$2; eng=$3; qd=$4; rw=$5
tmp=$(mktemp -d /tmp/loadcell.XXXX); mnt=$tmp/mnt; touch $mnt
w=""; [ "$rw" != randread ] && [ "$rw" != read ] && w=-w
$bin mount $w --pidfile $tmp/pid $img $mnt 2>$tmp/log &
d=$!
trap 'kill -TERM $d 2>/dev/null; wait $d 2>/dev/null; rm -rf $tmp' EXIT
for i in $(seq 100); do [[ -s $tmp/pid ]] && grep -q " $mnt " /proc/mounts && break; sleep 0.1; done
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' /proc/$d/stat; }
t0=$(ticks)
out=$(${bin}-lab bench load --file $mnt --rw $rw --engine $eng --iodepth $qd --seconds 5)
t1=$(ticks)
python3 -c "
import json, os, sys
j = json.loads(sys.argv[1]); tick_us = 1e6 / os.sysconf('SC_CLK_TCK')
print('%s %s %s qd%s %s iops %.0f cpu_us_per_op %.2f' % (sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], j['iops'], (int(sys.argv[8]) - int(sys.argv[7])) * tick_us / j['ops']))
" "$out" "$bin" "$img" "$eng" "$qd" "$rw" "$t0" "$t1"
