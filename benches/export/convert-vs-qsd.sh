#!/usr/bin/env bash
# qemu-img convert of a 1 GiB raw image into a writable export: corofuse against
# qemu-storage-daemon, interleaved, each result checked byte for byte.
#
# usage: benches/export/convert-vs-qsd.sh [TRIALS] [CPUS]
#   TRIALS  runs per server, interleaved corofuse/qsd, alternating who goes first (default 3)
#   CPUS    "" (default: no pinning), "same" (daemon and qemu-img on CPU 0) or "split"
#           (daemon on CPU 0, qemu-img on CPU 1)
# Needs root, /dev/fuse, qemu-img, qemu-storage-daemon, ~2.1 GiB free on /dev/shm and a
# release build of corofuse (cargo build --release -p corofuse). Extra corofuse options
# can be passed in COROFUSE_OPTS; another binary in COROFUSE.
#
# Each run: a fresh, empty 1 GiB raw image (sparse) on /dev/shm is exported writable over
# a regular file; `qemu-img convert -n -f raw -O raw -t none SRC MNT` copies a 1 GiB image
# of random data into it (-t none: O_DIRECT on the export, so every byte goes through the
# daemon; qemu-img writes up to 2 MiB per request, several in flight); the daemon is
# stopped (SIGTERM: flush, unmount), then `cmp SRC IMG` checks the result. A run whose
# image differs is reported as CORRUPT, with the number of 1 MiB blocks that differ, and
# is left out of the "verified" median. Prints a markdown table.
set -euo pipefail
trials=${1:-3} cpus=${2:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
corofuse=${COROFUSE:-$here/target/release/corofuse}
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in qemu-img qemu-storage-daemon python3; do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
run_prefix=() daemon_cpu=
case "$cpus" in
  same) run_prefix=(taskset -c 0) daemon_cpu=0 ;;
  split) run_prefix=(taskset -c 1) daemon_cpu=0 ;;
  "") ;;
  *) echo "CPUS must be empty, same or split" >&2; exit 2 ;;
esac

work=$(mktemp -d /dev/shm/corofuse-convert.XXXXXX)
daemon=
cleanup() {
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  umount -l "$work/mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
src=$work/src.raw img=$work/image.raw mnt=$work/mnt
touch "$mnt"
echo "writing 1 GiB of random data to $src ..." >&2
dd if=/dev/urandom of="$src" bs=1M count=1024 status=none

mounted() { grep -q " $mnt fuse" /proc/mounts; }

start() { # who
  rm -f "$work/pid" "$img"
  truncate -s 1G "$img"
  if [ "$1" = corofuse ]; then
    # shellcheck disable=SC2086
    "$corofuse" mount -w "$img" "$mnt" --pidfile "$work/pid" ${COROFUSE_OPTS:-} \
      >"$work/daemon.log" 2>&1 &
  else
    qemu-storage-daemon \
      --blockdev "node-name=f,driver=file,filename=$img,aio=io_uring" \
      --export "type=fuse,id=e,node-name=f,mountpoint=$mnt,writable=on" \
      --pidfile "$work/pid" >"$work/daemon.log" 2>&1 &
  fi
  daemon=$!
  for _ in $(seq 200); do
    [ -s "$work/pid" ] && mounted && break
    sleep 0.05
  done
  mounted || { echo "$1 did not mount:" >&2; cat "$work/daemon.log" >&2; exit 1; }
  if [ -n "$daemon_cpu" ]; then
    for t in /proc/$daemon/task/*; do taskset -pc "$daemon_cpu" "${t##*/}" >/dev/null; done
  fi
}

cpu_seconds() { # pid: user+system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

stop() {
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
  daemon=
  for _ in $(seq 100); do mounted || break; sleep 0.05; done
}

# Number of 1 MiB blocks in which $src and $img differ.
bad_blocks() {
  python3 - "$src" "$img" <<'EOF'
import sys
bad = 0
with open(sys.argv[1], "rb") as a, open(sys.argv[2], "rb") as b:
    while True:
        x, y = a.read(1 << 20), b.read(1 << 20)
        if not x and not y:
            break
        bad += x != y
print(bad)
EOF
}

declare -A times=() good=() notes=()
for t in $(seq "$trials"); do
  order="corofuse qsd"
  [ $((t % 2)) -eq 0 ] && order="qsd corofuse"
  for who in $order; do
    start "$who"
    cpu0=$(cpu_seconds "$daemon")
    t0=$(date +%s.%N)
    status=ok
    "${run_prefix[@]}" qemu-img convert -n -f raw -O raw -t none "$src" "$mnt" || status="qemu-img failed"
    t1=$(date +%s.%N)
    cpu1=$(cpu_seconds "$daemon")
    stop
    secs=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
    cpu=$(python3 -c "print(f'{$cpu1 - $cpu0:.2f}')")
    if cmp -s "$src" "$img"; then
      verdict="identical"
      good[$who]+="$secs "
    else
      verdict="CORRUPT: $(bad_blocks) of 1024 MiB blocks differ"
    fi
    [ "$status" = ok ] || verdict="$status; $verdict"
    times[$who]+="$secs "
    notes[$who]+="$secs s ($verdict, daemon CPU $cpu s); "
    echo "trial $t $who: $secs s, daemon CPU $cpu s, $verdict" >&2
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
echo "| server | median s (all runs) | median s (verified runs) | runs |"
echo "|---|---|---|---|"
for who in corofuse qsd; do
  echo "| $who | $(echo "${times[$who]}" | median) | $(echo "${good[$who]:-}" | median) | ${notes[$who]}|"
done
a=$(echo "${times[corofuse]}" | median) b=$(echo "${times[qsd]}" | median)
echo
echo "corofuse/qsd time (all runs): $(python3 -c "print(f'{$a/$b:.2f}x')")"
