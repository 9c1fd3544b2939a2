#!/usr/bin/env bash
# Usage: benches/perf/record-switch.sh [fp|dwarf] [OUT_DIR]
#
# Samples `corofuse-lab bench switch --case runtime_switch --case nop_coroutine` (cpu-clock)
# with call graphs, then prints the callers of the frames that run on coroutine stacks
# (Co::yield_now, Co::nop) and counts how many samples taken on a coroutine stack unwind
# through corosensei's trampoline into the loop (Inner::run_task). fp (default) crosses
# that boundary; dwarf stops at the trampoline. See PROFILING.md.
# Output: OUT_DIR (default: the repo's target/perf)/switch.MODE.{data,txt,json}.
set -euo pipefail

mode=${1:-fp}
case $mode in
fp) callgraph=(--call-graph fp -g) ;;
dwarf) callgraph=(--call-graph dwarf) ;;
*)
    echo "usage: $0 [fp|dwarf] [OUT_DIR]" >&2
    exit 2
    ;;
esac
out=$(realpath -m "${2:-$(dirname "$0")/../../target/perf}")
cd "$(dirname "$0")/../.."
mkdir -p "$out"
data=$out/switch.$mode.data

cargo build --release -p corofuse-lab
perf record "${callgraph[@]}" -o "$data" -- \
    target/release/corofuse-lab bench switch --case runtime_switch --case nop_coroutine \
    >"$out/switch.$mode.json"

# Caller graphs (-G) of the coroutine-side frames, heaviest first.
perf report -i "$data" --stdio --no-children -G \
    -S 'runtime::co::Co::yield_now,runtime::ops::<impl runtime::co::Co>::nop' \
    >"$out/switch.$mode.txt" 2>/dev/null
echo "report: $out/switch.$mode.txt"

# Of the samples whose chain reaches a coroutine's base, how many continue into the loop?
perf script -i "$data" -F ip,sym 2>/dev/null | awk -v mode="$mode" '
    BEGIN { RS = "" }
    { total++ }
    /stack_init_trampoline/ { on_co++; if (/Inner::run_task/) crossed++ }
    END { printf "%s: %d samples, %d reach stack_init_trampoline, %d of them continue into Inner::run_task\n", mode, total, on_co, crossed }'
