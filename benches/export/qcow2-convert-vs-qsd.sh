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
# FUSE export does so with O_DIRECT writes, see benches/HISTORY.md).
set -euo pipefail
trials=${1:-3} dir=${2:-/var/tmp}
[ "$(stat -f -c %T "$dir")" = tmpfs ] && { echo "$dir is tmpfs: pick a real file system" >&2; exit 2; }
work=$(mktemp -d "$dir/corofuse-qcow2.XXXXXX")
mnt=$work/mnt
# shellcheck source=benches/export/servers.sh
. "$(dirname "$0")/servers.sh"
touch "$mnt"
echo "writing 1 GiB of random data and converting it to qcow2 in $work ..." >&2
dd if=/dev/urandom of="$work/src.raw" bs=1M count=1024 status=none
qemu-img convert -f raw -O qcow2 "$work/src.raw" "$work/alloc.qcow2"

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
