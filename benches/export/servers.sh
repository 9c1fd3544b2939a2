# Sourced by the convert scripts in this folder: corofuse and qemu-storage-daemon exporting
# one image each over a regular file, started and stopped the same way for both, so the two
# servers differ only in what they are.
#
# Before sourcing, set `work` (a scratch directory) and `mnt` (the mount point file in it);
# optionally `daemon_cpu` (pin the daemon's threads to that CPU) and COROFUSE_OPTS (extra
# corofuse mount options). Gives: `start WHO IMAGE [FORMAT]`, `stop`, `mounted`,
# `cpu_seconds PID`, `median` (of the numbers on stdin), and a cleanup on exit that stops
# the daemon, unmounts and removes `work`.

daemon=
cleanup() {
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  umount -l "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
corofuse=${COROFUSE:-$here/target/release/corofuse}
[ -x "$corofuse" ] || { echo "build first: cargo build --release -p corofuse" >&2; exit 1; }
for tool in qemu-img qemu-storage-daemon python3; do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done

mounted() { grep -q " $mnt fuse" /proc/mounts; }

# WHO (corofuse or qsd) exports IMAGE writable on $mnt; with FORMAT, as that format
# (corofuse --format, a qsd format node over the file node), otherwise as each detects.
start() {
  local who=$1 image=$2 format=${3:-}
  rm -f "$work/pid"
  if [ "$who" = corofuse ]; then
    local as=()
    [ -n "$format" ] && as=(--format "$format")
    # shellcheck disable=SC2086
    "$corofuse" mount -w "${as[@]}" "$image" "$mnt" --pidfile "$work/pid" ${COROFUSE_OPTS:-} \
      >"$work/daemon.log" 2>&1 &
  else
    local node=f layer=()
    [ -n "$format" ] && { layer=(--blockdev "node-name=q,driver=$format,file=f"); node=q; }
    qemu-storage-daemon \
      --blockdev "node-name=f,driver=file,filename=$image,aio=io_uring" "${layer[@]}" \
      --export "type=fuse,id=e,node-name=$node,mountpoint=$mnt,writable=on" \
      --pidfile "$work/pid" >"$work/daemon.log" 2>&1 &
  fi
  daemon=$!
  for _ in $(seq 200); do
    [ -s "$work/pid" ] && mounted && break
    sleep 0.05
  done
  mounted || { echo "$who did not mount $image:" >&2; cat "$work/daemon.log" >&2; exit 1; }
  if [ -n "${daemon_cpu:-}" ]; then
    for t in /proc/$daemon/task/*; do taskset -pc "$daemon_cpu" "${t##*/}" >/dev/null; done
  fi
}

stop() {
  kill "$daemon"
  wait "$daemon" 2>/dev/null || true
  daemon=
  for _ in $(seq 100); do mounted || break; sleep 0.05; done
}

cpu_seconds() { # pid: user+system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
