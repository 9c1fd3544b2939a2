#!/usr/bin/env bash
# Usage: benches/perf/flamegraph.sh OUT.svg [-- COROFUSE_LAB_ARGS...]
#
# Records corofuse-lab (the lab's binary) with frame-pointer call graphs (cpu-clock) and renders a flame graph
# with inferno (`cargo install inferno` puts inferno-collapse-perf and inferno-flamegraph
# in ~/.cargo/bin). Without COROFUSE_LAB_ARGS it profiles
# `bench switch --case runtime_switch --case nop_coroutine`.
set -euo pipefail

if [[ $# -lt 1 || $1 == -* ]]; then
    echo "usage: $0 OUT.svg [-- COROFUSE_LAB_ARGS...]" >&2
    exit 2
fi
svg=$(realpath -m "$1")
shift
[[ ${1:-} == -- ]] && shift
args=("$@")
[[ ${#args[@]} -eq 0 ]] && args=(bench switch --case runtime_switch --case nop_coroutine)
export PATH=$HOME/.cargo/bin:$PATH
for tool in inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "$tool missing: cargo install inferno" >&2; exit 1; }
done

cd "$(dirname "$0")/../.."
cargo build --release -p corofuse-lab
data=$(mktemp --suffix=.perf.data)
trap 'rm -f "$data"' EXIT
perf record --call-graph fp -g -o "$data" -- target/release/corofuse-lab "${args[@]}" >/dev/null
perf script -i "$data" | inferno-collapse-perf | inferno-flamegraph >"$svg"
echo "flame graph: $svg"
