#!/usr/bin/env bash
# qcow2 images: corofuse's qcow2 backend against qemu-storage-daemon's qcow2 driver, on the
# same images on a real file system, interleaved, with corofuse's raw export of the same
# data beside them (the target: qcow2 reads within 0.8x of raw).
#
# usage: benches/export/qcow2-vs-qsd.sh [TRIALS] [SECONDS] [DIR]
#   TRIALS   runs of each cell per server, alternating who goes first (default 3)
#   SECONDS  fio runtime per run (default 5)
#   DIR      where the images live (default /var/tmp; not tmpfs: users' images are on disk)
# Needs root, /dev/fuse, fio, qemu-img, qemu-storage-daemon, python3, ~3.2 GiB free in DIR
# and a release build (cargo build --release -p corofuse); another binary in COROFUSE.
#
# Images: src.raw (1 GiB of random data), alloc.qcow2 (`qemu-img convert -O qcow2` of it:
# every cluster allocated, 64 KiB clusters) and, for each allocating-write run, a fresh
# empty.qcow2 (`qemu-img create -f qcow2 IMG 1G`). Both servers use their defaults for the
# host side (buffered I/O on the image file) and are started fresh for every run.
# Cells: fio 4 KiB random read and write at iodepth 1 (psync) and 64 (io_uring, 1 job),
# sequential 1 MiB reads, allocating 4 KiB random writes at iodepth 64 into the empty
# image, and `qemu-img convert -t none` of alloc.qcow2 into a raw export and of src.raw
# into an empty qcow2 export (timed, output checked with `qemu-img compare`).
# Prints markdown tables: medians, the corofuse/qsd ratio, and every run.
set -euo pipefail
trials=${1:-3} secs=${2:-5} dir=${3:-/var/tmp}
here=$(cd "$(dirname "$0")/../.." && pwd)
corofuse=${COROFUSE:-$here/target/release/corofuse}
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in fio qemu-img qemu-storage-daemon python3; do
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
  if [ "$who" = corofuse ] || [ "$who" = corofuse-raw ]; then
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

fio_run() { # rw bs engine depth: prints "IOPS MB/s"
  fio --name=t --filename="$mnt" --rw="$1" --bs="$2" --direct=1 --ioengine="$3" \
    --iodepth="$4" --time_based --runtime="$secs" --size=1G --output-format=json 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; r,w=j['read'],j['write']; print(int(r['iops']+w['iops']), int((r['bw_bytes']+w['bw_bytes'])/1e6))"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else '-')" "$1" "$2"; }

echo "| cell | corofuse qcow2 | qsd qcow2 | corofuse/qsd | corofuse raw (same data) | qcow2/raw | corofuse runs | qsd runs |"
echo "|---|---|---|---|---|---|---|---|"
cells=(
  "randread 4k psync 1 alloc"
  "randread 4k io_uring 64 alloc"
  "randwrite 4k psync 1 alloc"
  "randwrite 4k io_uring 64 alloc"
  "read 1M io_uring 4 alloc"
  "randwrite 4k io_uring 64 empty"
)
for cell in "${cells[@]}"; do
  # shellcheck disable=SC2086
  set -- $cell
  rw=$1 bs=$2 engine=$3 depth=$4 image=$5
  declare -A got=([corofuse]="" [qsd]="" [corofuse-raw]="")
  for t in $(seq "$trials"); do
    order="corofuse qsd"
    [ $((t % 2)) -eq 0 ] && order="qsd corofuse"
    [ "$image" = alloc ] && order+=" corofuse-raw"
    for who in $order; do
      if [ "$who" = corofuse-raw ]; then
        start "$who" "$work/src.raw" raw
      elif [ "$image" = empty ]; then
        rm -f "$work/empty.qcow2"
        qemu-img create -q -f qcow2 "$work/empty.qcow2" 1G
        start "$who" "$work/empty.qcow2" qcow2
      else
        start "$who" "$work/alloc.qcow2" qcow2
      fi
      read -r iops mbs < <(fio_run "$rw" "$bs" "$engine" "$depth")
      stop
      v=$iops
      [ "$bs" = 1M ] && v=$mbs
      got[$who]+="$v "
      echo "$rw $bs $engine qd$depth $image, trial $t, $who: $v" >&2
    done
  done
  unit="IOPS"
  [ "$bs" = 1M ] && unit="MB/s"
  a=$(echo "${got[corofuse]}" | median) b=$(echo "${got[qsd]}" | median)
  raw=$(echo "${got[corofuse-raw]}" | median)
  vs_raw="-"
  [ "$raw" != "-" ] && vs_raw=$(ratio "$a" "$raw")
  echo "| $rw $bs $engine qd$depth ($image image, $unit) | $a | $b | $(ratio "$a" "$b") | $raw | $vs_raw | ${got[corofuse]}| ${got[qsd]}|"
done

echo
echo "| qemu-img convert -t none (1 GiB) | corofuse s | qsd s | corofuse/qsd time | corofuse runs | qsd runs |"
echo "|---|---|---|---|---|---|"
for dir_ in "qcow2-into-raw" "raw-into-qcow2"; do
  declare -A took=([corofuse]="" [qsd]="")
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
      qemu-img compare -q -f "$sfmt" -F "$tfmt" "$src" "$target" || verdict=DIFFERENT
      secs_=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
      took[$who]+="$secs_ "
      echo "convert $dir_, trial $t, $who: $secs_ s (daemon CPU $(python3 -c "print(f'{$cpu1 - $cpu0:.2f}')") s), $verdict" >&2
      [ "$verdict" = identical ] || { echo "$who: the converted image differs" >&2; exit 1; }
    done
  done
  a=$(echo "${took[corofuse]}" | median) b=$(echo "${took[qsd]}" | median)
  echo "| $dir_ | $a | $b | $(ratio "$a" "$b") | ${took[corofuse]}| ${took[qsd]}|"
done
