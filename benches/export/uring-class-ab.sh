#!/bin/bash
# The table "FUSE over io_uring with its loops in the idle class" of BENCHMARKS.md: fio on a
# null export, fresh daemons, interleaved rounds (the order reversed every other round).
#   benches/export/uring-class-ab.sh ROUNDS SECS "FIO ARGS" "NAME=CorofuseMountArgs"...
# e.g. benches/export/uring-class-ab.sh 3 4 "--rw=randread --bs=4k --ioengine=psync" \
#        "default=" "uring=--transport uring" "uring-normal=--transport uring --uring-class normal"
# "NAME=@PATH ARGS" runs the binary PATH instead of BIN, to compare two builds.
# Prints: round, name, IOPS, daemon CPU us per request. Needs root; turns the fuse module's
# enable_uring on for the run and restores it. BIN: the corofuse binary (target/release).
# HOG=1: a spinning process pinned to each CPU during each fio run (the starvation guard).
set -eu
BIN=${BIN:-target/release/corofuse}
R=$1; SECS=$2; FIO=$3; shift 3
MNT=$(mktemp /tmp/uring-class-ab.XXXXXX)
SWITCH=/sys/module/fuse/parameters/enable_uring
BEFORE=$(cat $SWITCH)
pid=
cleanup() { [ -n "$pid" ] && { umount "$MNT" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; echo "$BEFORE" > $SWITCH; rm -f "$MNT"; }
trap cleanup EXIT
echo Y > $SWITCH
for r in $(seq "$R"); do
  if (( r % 2 )); then order=("$@"); else order=(); for ((i=$#;i>0;i--)); do order+=("${!i}"); done; fi
  for spec in "${order[@]}"; do
    name=${spec%%=*}; args=${spec#*=}
    # shellcheck disable=SC2086
    # "NAME=@PATH ARGS": that binary instead of BIN (two builds side by side).
    bin=$BIN; case $args in @*) bin=${args%% *}; bin=${bin#@}; args=${args#"@$bin"}; args=${args# };; esac
    "$bin" mount null:1G "$MNT" -w $args 2>/dev/null & pid=$!
    for _ in $(seq 100); do grep -q " $MNT " /proc/mounts && break; sleep 0.05; done; sleep 0.2
    hogs=()
    if [ "${HOG:-0}" = 1 ]; then
      for c in $(seq 0 $(( $(nproc) - 1 ))); do taskset -c "$c" timeout $(( SECS + 1 )) sh -c 'while :; do :; done' & hogs+=($!); done
    fi
    t0=$(awk '{print $14+$15}' /proc/$pid/stat)
    # shellcheck disable=SC2086
    out=$(fio --name=x --filename="$MNT" --direct=1 --size=1g --runtime="$SECS" --time_based --group_reporting --output-format=terse --terse-version=3 $FIO)
    t1=$(awk '{print $14+$15}' /proc/$pid/stat)
    for h in "${hogs[@]}"; do wait "$h" 2>/dev/null || true; done
    tick=$(getconf CLK_TCK)
    echo "$out" | awk -F';' -v t=$((t1-t0)) -v s="$name" -v r="$r" -v secs="$SECS" -v tick="$tick" \
      '{n=$8+$49; printf "%s\t%s\t%d\t%.1f\n", r, s, n, t*1e6/tick/(n*secs)}'
    umount "$MNT"; wait $pid; pid=
  done
done
