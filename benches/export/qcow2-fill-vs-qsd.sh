#!/usr/bin/env bash
# Filling a fresh qcow2 image through its export, as a `qemu-img convert` into it or a
# guest install does: corofuse's qcow2 backend against qemu-storage-daemon's qcow2 driver
# (and, with COROFUSE_B, a second corofuse binary: a before/after), interleaved, each
# result checked.
#
# usage: benches/export/qcow2-fill-vs-qsd.sh [TRIALS] [DIR]
#   TRIALS   rounds; each runs every server once, in an order that rotates (default 5)
#   DIR      where the images live (default /var/tmp; not tmpfs: users' images are on disk)
# Needs root, /dev/fuse, qemu-img, qemu-storage-daemon, fio, python3, ~3.2 GiB free in DIR
# and a release build (cargo build --release -p corofuse); COROFUSE names another binary,
# COROFUSE_B a second one (shown as corofuse-b).
#
# Two workloads, each into a fresh empty 1 GiB qcow2 image (64 KiB clusters) exported
# writable with both servers' defaults for the host side (buffered I/O on the image file):
#   convert  `qemu-img convert -n -f raw -O raw -t none SRC MNT` of 1 GiB of random data
#            (O_DIRECT on the export, so every byte goes through the daemon); the time, and
#            `qemu-img compare` of the image with the source (CORRUPT if they differ).
#   write1m  fio, 1 MiB sequential writes, io_uring, iodepth 4, O_DIRECT, 1 GiB once
#            through; the IOPS and p99 completion latency, `qemu-img check` afterwards.
# Prints one line per run on stderr and a markdown table of medians on stdout.
set -euo pipefail
trials=${1:-5} dir=${2:-/var/tmp}
[ "$(stat -f -c %T "$dir")" = tmpfs ] && { echo "$dir is tmpfs: pick a real file system" >&2; exit 2; }
command -v fio >/dev/null || { echo "fio is not installed" >&2; exit 1; }
work=$(mktemp -d "$dir/corofuse-fill.XXXXXX")
mnt=$work/mnt
# shellcheck source=benches/export/servers.sh
. "$(dirname "$0")/servers.sh"
touch "$mnt"
echo "writing 1 GiB of random data in $work ..." >&2
dd if=/dev/urandom of="$work/src.raw" bs=1M count=1024 status=none
sync

servers=(corofuse qsd)
[ -n "${COROFUSE_B:-}" ] && servers=(corofuse corofuse-b qsd)
main_binary=$corofuse
declare -A results=()

# run WHO WORKLOAD: one run on a fresh image; appends "value" to results[WHO/WORKLOAD].
run() {
  local who=$1 load=$2 image=$work/target.qcow2 as=$1
  rm -f "$image"
  qemu-img create -q -f qcow2 "$image" 1G
  corofuse=$main_binary
  if [ "$who" = corofuse-b ]; then corofuse=$COROFUSE_B as=corofuse; fi
  start "$as" "$image" qcow2
  local cpu0 cpu1 value verdict
  cpu0=$(cpu_seconds "$daemon")
  if [ "$load" = convert ]; then
    local t0 t1
    t0=$(date +%s.%N)
    qemu-img convert -n -f raw -O raw -t none "$work/src.raw" "$mnt"
    t1=$(date +%s.%N)
    value=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  else
    fio --name=fill --filename="$mnt" --rw=write --bs=1M --iodepth=4 --ioengine=io_uring \
      --direct=1 --size=1G --output-format=json >"$work/fio.json" 2>/dev/null
    value=$(python3 -c "
import json; j = json.load(open('$work/fio.json'))['jobs'][0]['write']
print(f\"{j['iops']:.0f} {j['clat_ns']['percentile']['99.000000'] / 1e6:.1f}\")")
  fi
  cpu1=$(cpu_seconds "$daemon")
  stop
  if [ "$load" = convert ]; then
    verdict=identical
    qemu-img compare -q -f raw -F qcow2 "$work/src.raw" "$image" || verdict=CORRUPT
  else
    verdict=clean
    qemu-img check -q -f qcow2 "$image" >/dev/null 2>&1 || verdict="check exit $?"
  fi
  results[$who/$load]+="$value;"
  echo "$load, $who: $value (daemon CPU $(python3 -c "print(f'{$cpu1 - $cpu0:.2f}')") s), $verdict" >&2
}

for t in $(seq "$trials"); do
  n=${#servers[@]} order=()
  for i in $(seq 0 $((n - 1))); do order+=("${servers[$(((i + t) % n))]}"); done
  for load in convert write1m; do
    for who in "${order[@]}"; do run "$who" "$load"; done
  done
done

col() { # WHO LOAD FIELD: the median of field FIELD of each run's value
  echo "${results[$1/$2]}" | tr ';' '\n' | awk -v f="$3" 'NF {print $f}' | median
}
echo "| server | convert s | write1m IOPS | write1m p99 ms |"
echo "|---|---|---|---|"
for who in "${servers[@]}"; do
  echo "| $who | $(col "$who" convert 1) | $(col "$who" write1m 1) | $(col "$who" write1m 2) |"
done
