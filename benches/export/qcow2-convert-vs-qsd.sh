#!/usr/bin/env bash
# qemu-img convert through qcow2 exports: corofuse's qcow2 backend against
# qemu-storage-daemon's qcow2 driver, interleaved, each result checked with qemu-img
# compare. (The fio rows on qcow2 images are in the lab: `corofuse bench --only
# qcow2,qcow2-alloc --compare-qsd`.)
#
# usage: benches/export/qcow2-convert-vs-qsd.sh [TRIALS] [DIR]
#   TRIALS   runs per direction and server, alternating who goes first (default 3)
#   DIR      where the images live (default /var/tmp; not tmpfs: users' images are on disk)
# Needs root, /dev/fuse, qemu-img, qemu-storage-daemon, python3, ~3.2 GiB free in DIR
# and a release build (cargo build --release -p corofuse); another binary in COROFUSE.
#
# Images: src.raw (1 GiB of random data) and alloc.qcow2 (`qemu-img convert -O qcow2` of
# it, 64 KiB clusters). Two directions, each into a fresh target exported writable:
# alloc.qcow2 into the export of an empty raw image ("qcow2-into-raw": the raw export
# reads a qcow2 source), and src.raw into the export of an empty qcow2 image
# ("raw-into-qcow2": every write allocates), both `qemu-img convert -n -t none` (O_DIRECT
# on the export, so every byte goes through the daemon). Both servers use their defaults
# for the host side (buffered I/O on the image file) and start fresh for every run.
# Prints a markdown table: medians, the corofuse/qsd time ratio, every run with its check
# (CORRUPT when `qemu-img compare` finds the target differs from the source: qsd 10.0.2's
# FUSE export does so with O_DIRECT writes, see BENCHMARKS.md).
set -euo pipefail
trials=${1:-3} dir=${2:-/var/tmp}
here=$(cd "$(dirname "$0")/../.." && pwd)
corofuse=${COROFUSE:-$here/target/release/corofuse}
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in qemu-img qemu-storage-daemon python3; do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
[ "$(stat -f -c %T "$dir")" = tmpfs ] && { echo "$dir is tmpfs: pick a real file system" >&2; exit 2; }
work=$(mktemp -d "$dir/corofuse-qcow2.XXXXXX")
daemon=
cleanup() {
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mnt=$work/mnt
touch "$mnt"
echo "writing 1 GiB of random data and converting it to qcow2 in $work ..." >&2
dd if=/dev/urandom of="$work/src.raw" bs=1M count=1024 status=none
qemu-img convert -f raw -O qcow2 "$work/src.raw" "$work/alloc.qcow2"

mounted() { grep -q " $mnt fuse" /proc/mounts; }

start() { # who image format
  local who=$1 image=$2 format=$3
  rm -f "$work/pid"
  if [ "$who" = corofuse ]; then
    "$corofuse" mount -w --format "$format" "$image" "$mnt" --pidfile "$work/pid" \
      >"$work/daemon.log" 2>&1 &
  else
    qemu-storage-daemon \
      --blockdev "node-name=f,driver=file,filename=$image,aio=io_uring" \
      --blockdev "node-name=q,driver=$format,file=f" \
      --export "type=fuse,id=e,node-name=q,mountpoint=$mnt,writable=on" \
      --pidfile "$work/pid" >"$work/daemon.log" 2>&1 &
  fi
  daemon=$!
  for _ in $(seq 200); do
    [ -s "$work/pid" ] && mounted && break
    sleep 0.05
  done
  mounted || { echo "$who did not mount $image:" >&2; cat "$work/daemon.log" >&2; exit 1; }
}
stop() {
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
  daemon=
  for _ in $(seq 100); do mounted || break; sleep 0.05; done
}
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else '-')" "$1" "$2"; }

echo "| qemu-img convert -t none (1 GiB) | corofuse s | qsd s | corofuse/qsd time | corofuse runs | qsd runs |"
echo "|---|---|---|---|---|---|"
for dir_ in "qcow2-into-raw" "raw-into-qcow2"; do
  declare -A took=([corofuse]="" [qsd]="") runs=([corofuse]="" [qsd]="")
  for t in $(seq "$trials"); do
    order="corofuse qsd"
    [ $((t % 2)) -eq 0 ] && order="qsd corofuse"
    for who in $order; do
      if [ "$dir_" = qcow2-into-raw ]; then
        src=$work/alloc.qcow2 sfmt=qcow2 target=$work/target.raw tfmt=raw
        rm -f "$target"; truncate -s 1G "$target"
      else
        src=$work/src.raw sfmt=raw target=$work/target.qcow2 tfmt=qcow2
        rm -f "$target"; qemu-img create -q -f qcow2 "$target" 1G
      fi
      start "$who" "$target" "$tfmt"
      cpu0=$(cpu_seconds "$daemon")
      t0=$(date +%s.%N)
      qemu-img convert -n -f "$sfmt" -O raw -t none "$src" "$mnt"
      t1=$(date +%s.%N)
      cpu1=$(cpu_seconds "$daemon")
      stop
      verdict=identical
      qemu-img compare -q -f "$sfmt" -F "$tfmt" "$src" "$target" || verdict=CORRUPT
      secs_=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
      took[$who]+="$secs_ "
      runs[$who]+="$secs_ s $verdict; "
      echo "convert $dir_, trial $t, $who: $secs_ s (daemon CPU $(python3 -c "print(f'{$cpu1 - $cpu0:.2f}')") s), $verdict" >&2
    done
  done
  a=$(echo "${took[corofuse]}" | median) b=$(echo "${took[qsd]}" | median)
  echo "| $dir_ | $a | $b | $(ratio "$a" "$b") | ${runs[corofuse]}| ${runs[qsd]}|"
done
