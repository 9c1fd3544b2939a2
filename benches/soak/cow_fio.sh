#!/bin/bash
# fio 4 KiB randwrite into a fresh qcow2 image, with and without a raw backing file, through
# `corofuse mount`, for each binary given, in interleaved rounds: IOPS and the daemon's CPU
# per request (utime+stime of the daemon over fio's I/Os). The copy-on-write price (issue 35).
# Usage: cow_fio.sh ROUNDS DIR BIN... (DIR on the file system to measure, e.g. ext4)
set -eu
rounds=$1 dir=$2; shift 2
runtime=${RUNTIME:-6}
mkdir -p "$dir"
truncate -s 1G "$dir/backing.raw"
# Data in the backing file (copied by each copy-on-write), sparse elsewhere.
fio --name=fill --filename="$dir/backing.raw" --rw=write --bs=1M --size=1G --ioengine=psync \
    --output=/dev/null
qemu-img create -q -f qcow2 -o compat=1.1 "$dir/plain.tmpl" 1G
qemu-img create -q -f qcow2 -o "compat=1.1,backing_file=$dir/backing.raw,backing_fmt=raw" \
    "$dir/over.tmpl"
mnt=$dir/mnt; touch "$mnt"
ticks=$(getconf CLK_TCK)
run() { # BIN SHAPE DEPTH
    cp "$dir/$2.tmpl" "$dir/img.qcow2"
    "$1" -q mount "$dir/img.qcow2" "$mnt" -w --format qcow2 & pid=$!
    for _ in $(seq 100); do grep -q " $mnt fuse" /proc/mounts && break; sleep 0.05; done
    cpu0=$(awk '{print $14+$15}' /proc/$pid/stat)
    engine=psync; [ "$3" -gt 1 ] && engine=io_uring
    out=$(fio --name=w --filename="$mnt" --rw=randwrite --bs=4k --direct=1 --ioengine=$engine \
        --iodepth="$3" --runtime="$runtime" --time_based --size=1G --randrepeat=0 \
        --output-format=terse --terse-version=3)
    cpu1=$(awk '{print $14+$15}' /proc/$pid/stat)
    kill -TERM $pid; wait $pid || true
    echo "$out" | awk -F';' -v b="$(basename "$1")" -v s="$2" -v d="$3" -v c=$((cpu1-cpu0)) \
        -v t="$ticks" '{ios=$47/4; iops=$49; printf "%s %s qd%s %d IOPS %.1f us/req\n", b, s, d, iops, (ios>0? c/t*1e6/ios : 0)}'
}
for r in $(seq "$rounds"); do
    for depth in 1 64; do
        for shape in plain over; do
            for bin in "$@"; do run "$bin" "$shape" "$depth"; done
        done
    done
done
rm -f "$dir/img.qcow2" "$dir"/*.tmpl "$dir/backing.raw" "$mnt"
