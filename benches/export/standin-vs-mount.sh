#!/bin/bash
# Usage: benches/export/standin-vs-mount.sh [ROUNDS] (as root; a release build in target/release)
# Interleaved fio, same settings both ways (corofuse's defaults):
#   null:  `corofuse mount null:1G MNT -w` vs corofuse as qemu-storage-daemon with
#          --blockdev null-co,size=1G,read-zeroes=on --export fuse,writable=on
#   tmpfs: `corofuse mount --format raw IMG MNT -w` (IMG 1 GiB on /dev/shm) vs
#          --blockdev file,filename=IMG --blockdev raw,file=f --export fuse,writable=on
# Each line: workload, backend, server, round, IOPS and the daemon's CPU per request.
cd "$(dirname "$0")/../.."
B=$PWD/target/release/corofuse
ROUNDS=${1:-3}
W=$(mktemp -d); I=$(mktemp -d /dev/shm/standin.XXXX)
trap 'rm -rf "$W" "$I"' EXIT
Q=$W/qemu-storage-daemon; ln -s "$B" "$Q"
M=$W/mnt; touch $M
IMG=$I/disk.img; truncate -s 1G $IMG
TCK=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
start() { # server backend
  case $1-$2 in
    mount-null) $B mount null:1G $M -w 2>/dev/null & P=$! ;;
    mount-tmpfs) $B mount --format raw $IMG $M -w 2>/dev/null & P=$! ;;
    qsd-null) $Q --blockdev node-name=f,driver=null-co,size=1073741824,read-zeroes=on \
        --export type=fuse,id=e,node-name=f,mountpoint=$M,writable=on & P=$! ;;
    qsd-tmpfs) $Q --blockdev file,node-name=f,filename=$IMG --blockdev raw,node-name=r,file=f \
        --export type=fuse,id=e,node-name=r,mountpoint=$M,writable=on & P=$! ;;
  esac
  for i in $(seq 200); do grep -q " $M " /proc/mounts && break; sleep 0.02; done
}
run() { # server backend workload-args
  local kind=$1 be=$2; shift 2
  start $kind $be
  c0=$(cpu $P)
  out=$(fio --name=t --filename=$M --direct=1 --bs=4k --runtime=4 --time_based --output-format=terse --terse-version=3 "$@" 2>/dev/null)
  c1=$(cpu $P)
  kill $P; wait $P
  iops=$(echo "$out" | awk -F';' '{print $8+$49}')
  echo "$iops $(( (c1-c0)*1000000/TCK ))"
}
for be in null tmpfs; do
  for w in "--rw=randread --ioengine=psync --iodepth=1" "--rw=randread --ioengine=io_uring --iodepth=64" "--rw=randwrite --ioengine=io_uring --iodepth=64"; do
    for r in $(seq $ROUNDS); do
      for k in mount qsd; do
        set -- $(run $k $be $w); echo "$w | $be | $k round $r: $1 IOPS, cpu $(( $2 * 1000 / ($1*4 + 1) )) ns/req"
      done
    done
  done
done
