#!/bin/bash
# Usage: benches/perf/machinery-share.sh BIN OUTDIR [SECONDS [ENGINE IODEPTH]]   (as root)
# Mounts null:1G with BIN (coroutine dispatch, no --stats),
# drives 4 KiB O_DIRECT randread (psync qd1 unless ENGINE and IODEPTH are given, e.g.
# io_uring 64) with BIN-lab's `bench load` (corofuse-lab beside BIN), samples the whole machine
# with perf record -a during the load, and splits the daemon's samples by source file of the
# innermost (inlined) frame.
set -euo pipefail
bin=$(realpath "$1"); out=$2; secs=${3:-5}; engine=${4:-psync}; qd=${5:-1}
mkdir -p $out; tmp=$(mktemp -d /tmp/fshare.XXXX); mnt=$tmp/mnt; touch $mnt
$bin mount --dispatch coroutine --pidfile $tmp/pid null:1G $mnt 2>$tmp/log &
d=$!
for i in $(seq 100); do [[ -s $tmp/pid ]] && grep -q " $mnt " /proc/mounts && break; sleep 0.1; done
t0=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' /proc/$d/stat)
perf record -a -g --call-graph fp -o $out/perf.data -- ${bin}-lab bench load --file $mnt --rw randread --engine $engine --iodepth $qd --seconds $secs > $out/load.json 2>/dev/null
t1=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' /proc/$d/stat)
kill -TERM $d; wait $d || true
rm -rf $tmp
echo "daemon_ticks $((t1-t0)) pid $d" > $out/summary.txt
cat $out/load.json >> $out/summary.txt
python3 "$(dirname "$0")/machinery-share.py" $out/perf.data $bin $d >> $out/summary.txt
cat $out/summary.txt
