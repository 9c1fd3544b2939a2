#!/usr/bin/env bash
# The NBD client side by side: corofuse's nbd backend against qemu-storage-daemon's
# driver=nbd behind its FUSE export, both clients of one qemu-nbd serving a raw file, with
# the server's ceiling beside them (fio's nbd engine: libnbd straight to the server, no
# FUSE and no kernel in between).
#
# usage: benches/export/nbd-vs-qsd.sh [TRIALS] [SECONDS]
#   TRIALS   rounds, each running corofuse, qsd and the ceiling in turn, the order flipped
#            every other round (A B C, C B A, ...); medians are reported (default 3)
#   SECONDS  fio runtime per run (default 5)
# Needs root, /dev/fuse, fio (with its nbd engine for the ceiling), qemu-nbd,
# qemu-storage-daemon and a release build (cargo build --release -p corofuse).
# The image is a 1 GiB raw file of random data on /var/tmp (a real disk, not tmpfs), served
# with `qemu-nbd --shared=16 --cache=writeback` (its default: the page cache holds the
# image after the first pass, so the clients are measured, not the disk); CACHE=none runs
# `--cache=none --aio=io_uring` instead, where the disk limits all three alike.
# Prints a markdown table: IOPS medians, ratios, and CPU per request (µs of the client
# daemon's utime+stime, and of qemu-nbd's, over the run divided by its I/Os). Extra
# corofuse options: COROFUSE_OPTS; another binary: COROFUSE=PATH.
set -euo pipefail
trials=${1:-3} secs=${2:-5}
cache=${CACHE:-writeback} aio=threads
[ "$cache" = none ] && aio=io_uring
here=$(cd "$(dirname "$0")/../.." && pwd)
corofuse=${COROFUSE:-$here/target/release/corofuse}
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in fio qemu-nbd qemu-storage-daemon python3; do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
ceiling=yes
fio --enghelp 2>/dev/null | grep -qw nbd || ceiling=
work=$(mktemp -d /var/tmp/corofuse-nbd-vs-qsd.XXXXXX)
daemon= server=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
touch "$work/mnt"
dd if=/dev/urandom of="$work/image.raw" bs=1M count=1024 status=none
sock=$work/nbd.sock
qemu-nbd -f raw -x '' --socket="$sock" --persistent --shared=16 --cache="$cache" \
  --aio="$aio" "$work/image.raw" >/dev/null 2>&1 &
server=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
uri="nbd+unix:///?socket=$sock"

start() { # who
  rm -f "$work/pid"
  case $1 in
    corofuse)
      # shellcheck disable=SC2086
      "$corofuse" mount -w "$uri" "$work/mnt" --pidfile "$work/pid" ${COROFUSE_OPTS:-} \
        >/dev/null 2>&1 & ;;
    qsd)
      qemu-storage-daemon \
        --blockdev "driver=nbd,node-name=n,server.type=unix,server.path=$sock,export=" \
        --export type=fuse,id=e,node-name=n,mountpoint="$work/mnt",writable=on \
        --pidfile "$work/pid" >/dev/null 2>&1 & ;;
    ceiling) daemon=; return ;;
  esac
  daemon=$!
  for _ in $(seq 200); do
    [ -s "$work/pid" ] && grep -q " $work/mnt fuse" /proc/mounts && return
    sleep 0.05
  done
  echo "$1 did not come up" >&2; exit 1
}
stop() { [ -z "$daemon" ] && return; kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=; }
ticks() { [ -z "$1" ] && { echo 0; return; }; awk '{print $14 + $15}' "/proc/$1/stat"; }

run() { # who rw engine depth -> "iops client_us_per_io server_us_per_io"
  local who=$1 rw=$2 engine=$3 depth=$4 target
  target=(--filename="$work/mnt" --ioengine="$engine")
  [ "$who" = ceiling ] && target=(--ioengine=nbd --uri="$uri")
  local c0 s0 out
  c0=$(ticks "$daemon") s0=$(ticks "$server")
  out=$(fio --name=t "${target[@]}" --rw="$rw" --bs=4k --direct=1 --iodepth="$depth" \
    --time_based --runtime="$secs" --size=1G --output-format=json 2>/dev/null |
    sed -n '/^{/,$p')  # the nbd engine prints a line before the JSON
  local c1 s1
  c1=$(ticks "$daemon") s1=$(ticks "$server")
  echo "$out" | python3 -c "
import json, os, sys
j = json.load(sys.stdin)['jobs'][0]
ios = j['read']['total_ios'] + j['write']['total_ios']
hz = os.sysconf('SC_CLK_TCK')
us = lambda t: t * 1e6 / hz / max(ios, 1)
print(int(j['read']['iops'] + j['write']['iops']), f'{us($c1 - $c0):.1f}', f'{us($s1 - $s0):.1f}')"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

who_all=(corofuse qsd)
[ -n "$ceiling" ] && who_all+=(ceiling)
echo "| workload | corofuse IOPS | qsd IOPS | ceiling IOPS | vs qsd | vs ceiling | corofuse µs CPU/IO (server) | qsd µs CPU/IO (server) | corofuse runs | qsd runs | ceiling runs |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for wl in "randread psync 1" "randwrite psync 1" "randread io_uring 64" "randwrite io_uring 64"; do
  # shellcheck disable=SC2086
  set -- $wl
  declare -A iops=() cpu=() srv=()
  for t in $(seq "$trials"); do
    order=("${who_all[@]}")
    [ $((t % 2)) = 0 ] && order=($(printf '%s\n' "${who_all[@]}" | tac))
    for who in "${order[@]}"; do
      start "$who"
      read -r v c s < <(run "$who" "$1" "$2" "$3")
      stop
      iops[$who]+="$v " cpu[$who]+="$c " srv[$who]+="$s "
    done
  done
  a=$(echo "${iops[corofuse]}" | median) b=$(echo "${iops[qsd]}" | median)
  c=n/a vc=n/a
  if [ -n "$ceiling" ]; then
    c=$(echo "${iops[ceiling]}" | median)
    vc=$(python3 -c "print(f'{$a/$c:.2f}x')")
  fi
  ratio=$(python3 -c "print(f'{$a/$b:.2f}x')")
  cc="$(echo "${cpu[corofuse]}" | median) ($(echo "${srv[corofuse]}" | median))"
  qc="$(echo "${cpu[qsd]}" | median) ($(echo "${srv[qsd]}" | median))"
  echo "| $1 $2 iodepth=$3 | $a | $b | $c | $ratio | $vc | $cc | $qc | ${iops[corofuse]}| ${iops[qsd]}| ${iops[ceiling]:-}|"
  unset iops cpu srv
done
