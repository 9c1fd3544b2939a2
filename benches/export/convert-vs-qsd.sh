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
run_prefix=() daemon_cpu=
case "$cpus" in
  same) run_prefix=(taskset -c 0) daemon_cpu=0 ;;
  split) run_prefix=(taskset -c 1) daemon_cpu=0 ;;
  "") ;;
  *) echo "CPUS must be empty, same or split" >&2; exit 2 ;;
esac

work=$(mktemp -d /dev/shm/corofuse-convert.XXXXXX)
src=$work/src.raw img=$work/image.raw mnt=$work/mnt
# shellcheck source=benches/export/servers.sh
. "$(dirname "$0")/servers.sh"
touch "$mnt"
echo "writing 1 GiB of random data to $src ..." >&2
dd if=/dev/urandom of="$src" bs=1M count=1024 status=none

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
    rm -f "$img"
    truncate -s 1G "$img"
    start "$who" "$img"
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

echo "| server | median s (all runs) | median s (verified runs) | runs |"
echo "|---|---|---|---|"
for who in corofuse qsd; do
  echo "| $who | $(echo "${times[$who]}" | median) | $(echo "${good[$who]:-}" | median) | ${notes[$who]}|"
done
a=$(echo "${times[corofuse]}" | median) b=$(echo "${times[qsd]}" | median)
echo
echo "corofuse/qsd time (all runs): $(python3 -c "print(f'{$a/$b:.2f}x')")"
