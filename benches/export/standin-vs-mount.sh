#!/bin/bash
# Usage: benches/export/standin-vs-mount.sh (as root; a release build in target/release)
# Interleaved fio: `corofuse mount null:1G MNT -w` vs corofuse as qemu-storage-daemon
# with --blockdev null-co,size=1G,read-zeroes=on --export fuse,writable=on (same defaults).
cd "$(dirname "$0")/../.."
B=$PWD/target/release/corofuse
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
Q=$W/qemu-storage-daemon; ln -s "$B" "$Q"
M=$W/mnt; touch $M
TCK=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
run() { # kind workload-args
  local kind=$1; shift
  if [ $kind = mount ]; then $B mount null:1G $M -w 2>/dev/null & P=$!
  else $Q --blockdev node-name=f,driver=null-co,size=1073741824,read-zeroes=on --export type=fuse,id=e,node-name=f,mountpoint=$M,writable=on & P=$!; fi
  for i in $(seq 200); do grep -q " $M " /proc/mounts && break; sleep 0.02; done
  c0=$(cpu $P)
  out=$(fio --name=t --filename=$M --direct=1 --bs=4k --runtime=4 --time_based --output-format=terse --terse-version=3 "$@" 2>/dev/null)
  c1=$(cpu $P)
  kill $P; wait $P
  iops=$(echo "$out" | awk -F';' '{print $8+$49}')
  echo "$kind $iops $(( (c1-c0)*1000000/TCK ))"
}
for w in "--rw=randread --ioengine=psync --iodepth=1" "--rw=randread --ioengine=io_uring --iodepth=64" "--rw=randwrite --ioengine=io_uring --iodepth=64"; do
  for r in 1 2 3; do
    for k in mount qsd; do
      set -- $(run $k $w); echo "$w | $1 round $r: $2 IOPS, cpu $(( $3 / ($2*4 + 1) )) us/req"
    done
  done
done
