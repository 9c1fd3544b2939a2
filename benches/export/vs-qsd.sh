#!/usr/bin/env bash
# Side by side: corofuse against qemu-storage-daemon's FUSE export, same machine, same run.
#
# usage: benches/export/vs-qsd.sh [TRIALS] [SECONDS] [CPUS]
#   TRIALS   runs of each cell, interleaved corofuse/qsd (default 3); medians are reported
#   SECONDS  fio runtime per run (default 5)
#   CPUS     "" (default: let the scheduler place daemon and fio), "same" (both on CPU 0),
#            or "split" (daemon on CPU 0, fio on CPU 1). At iodepth 1 this placement decides
#            the result: a wakeup of a halted vCPU costs ~20 us here.
# Needs root, /dev/fuse, fio, qemu-storage-daemon, and a release build of corofuse
# (cargo build --release -p corofuse). Prints a markdown table: IOPS medians and ratios.
# Extra corofuse options can be passed in COROFUSE_OPTS.
set -euo pipefail
trials=${1:-3} secs=${2:-5} cpus=${3:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
corofuse=$here/target/release/corofuse
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in fio qemu-storage-daemon; do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
work=$(mktemp -d /dev/shm/corofuse-vs-qsd.XXXXXX)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
touch "$work/mnt"
truncate -s 1G "$work/image.raw"
dd if=/dev/urandom of="$work/image.raw" bs=1M count=1024 conv=notrunc status=none

fio_prefix=() daemon_cpu=
case "$cpus" in
  same) fio_prefix=(taskset -c 0) daemon_cpu=0 ;;
  split) fio_prefix=(taskset -c 1) daemon_cpu=0 ;;
  "") ;;
  *) echo "CPUS must be empty, same or split" >&2; exit 2 ;;
esac

start() { # who backend
  local who=$1 backend=$2
  rm -f "$work/pid"
  if [ "$who" = corofuse ]; then
    local image=null:1G
    [ "$backend" = file ] && image=$work/image.raw
    # shellcheck disable=SC2086
    "$corofuse" mount "$image" "$work/mnt" -w --pidfile "$work/pid" ${COROFUSE_OPTS:-} >/dev/null 2>&1 &
  else
    local dev="node-name=f,driver=null-co,size=1073741824,read-zeroes=on"
    [ "$backend" = file ] && dev="node-name=f,driver=file,filename=$work/image.raw,aio=io_uring"
    qemu-storage-daemon --blockdev "$dev" \
      --export type=fuse,id=e,node-name=f,mountpoint="$work/mnt",writable=on \
      --pidfile "$work/pid" >/dev/null 2>&1 &
  fi
  daemon=$!
  for _ in $(seq 100); do
    [ -s "$work/pid" ] && grep -q " $work/mnt fuse" /proc/mounts && break
    sleep 0.05
  done
  if [ -n "$daemon_cpu" ]; then
    for t in /proc/$daemon/task/*; do taskset -pc "$daemon_cpu" "${t##*/}" >/dev/null; done
  fi
}
stop() { kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=; }

iops() { # rw engine depth
  "${fio_prefix[@]}" fio --name=t --filename="$work/mnt" --rw="$1" --bs=4k --direct=1 \
    --ioengine="$2" --iodepth="$3" --time_based --runtime="$secs" --size=1G \
    --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print(int(j['read']['iops']+j['write']['iops']))"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| backend | workload | corofuse IOPS | qsd IOPS | ratio | corofuse runs | qsd runs |"
echo "|---|---|---|---|---|---|---|"
for backend in null file; do
  for wl in "randread psync 1" "randwrite psync 1" "randread io_uring 64" "randwrite io_uring 64"; do
    # shellcheck disable=SC2086
    set -- $wl
    cf="" qs=""
    for t in $(seq "$trials"); do
      for who in corofuse qsd; do
        start $who $backend
        v=$(iops "$1" "$2" "$3")
        stop
        if [ $who = corofuse ]; then cf+="$v "; else qs+="$v "; fi
      done
    done
    a=$(echo "$cf" | median) b=$(echo "$qs" | median)
    ratio=$(python3 -c "print(f'{$a/$b:.2f}x')")
    echo "| $backend | $1 $2 iodepth=$3 | $a | $b | $ratio | $cf| $qs|"
  done
done
