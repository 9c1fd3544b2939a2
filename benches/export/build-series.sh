#!/usr/bin/env bash
# Builds the peer that fio-servers.py calls "series": qemu-storage-daemon from QEMU's
# multi-threaded FUSE export series (v3, posted 2025-07-01, not merged upstream), whose
# export takes several iothreads (`iothread.0=...,iothread.1=...`). It is the strongest
# FUSE block export there is to compare with, and no distribution ships it.
#
# For side-by-side runs on your machine only: never part of the project or of CI.
# Installs the build's Debian packages, fetches the series' branch (a mirror of the
# mailing list's patches applied on upstream) unless $SERIES_SRC already holds it, builds
# only qemu-storage-daemon (~2 minutes on 2 CPUs) and installs it at $QSD_SERIES, where
# fio-servers.py looks.
#
#   benches/export/build-series.sh
#   QSD_SERIES=/opt/qsd-series SERIES_SRC=/var/tmp/qemu-series benches/export/build-series.sh
set -euo pipefail

branch=20250701114437.207419-1-hreitz@redhat.com
repo=${SERIES_REPO:-https://github.com/pbo-linaro/qemu-ci}
src=${SERIES_SRC:-/work/peers/src}
out=${QSD_SERIES:-/work/peers/bin/qsd-series}

need=()
for pkg in libglib2.0-dev libfuse3-dev liburing-dev libaio-dev flex bison libzstd-dev \
  python3-tomli ninja-build pkg-config git; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x "$src/configure" ]; then
  git clone --quiet --depth 1 --branch "$branch" "$repo" "$src"
fi
# configure updates the git submodules it needs unless they are there; a shallow clone or
# an archive has none, and the tools do not use keycodemapdb: an empty one satisfies it.
mkdir -p "$src/subprojects/keycodemapdb"
touch "$src/subprojects/keycodemapdb/README"

cd "$src"
./configure --target-list= --disable-system --disable-user --enable-tools --enable-fuse \
  --enable-linux-io-uring --disable-docs --disable-werror >/dev/null
ninja -C build storage-daemon/qemu-storage-daemon >/dev/null
install -D build/storage-daemon/qemu-storage-daemon "$out"
"$out" --version | head -n 1
echo "installed at $out"
