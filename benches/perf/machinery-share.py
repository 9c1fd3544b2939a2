#!/usr/bin/env python3
"""machinery-share.py PERF_DATA BIN PID: the daemon's samples (perf record -a) split by the
source file of the innermost non-std (inlined) frame at the sampled instruction; prints the
share of "coroutine machinery": executor, coro_store, job, run_queue, worker, stack_pool, counters, resume, fast_paths, sched, spawn,
loop_cell, task, join, co, corosensei and the catch_unwind around the resume."""
import collections, re, subprocess, sys
data, binary, pid = sys.argv[1], sys.argv[2], sys.argv[3]
mm = subprocess.run(["perf", "script", "-i", data, "--show-mmap-events"], capture_output=True, text=True).stdout
base = None
for l in mm.splitlines():
    m = re.search(r"PERF_RECORD_MMAP2 %s/\d+: \[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+|0) .*r-xp %s$" % (pid, re.escape(binary)), l)
    if m:
        base = (int(m[1], 16), int(m[2], 16), int(m[3], 16)); break
seg = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True).stdout
delta = next(int(f[2], 16) - int(f[1], 16) for f in (l.split() for l in seg.splitlines()) if f[:1] == ["LOAD"] and "E" in f[-2:-1] or (f[:1] == ["LOAD"] and f[-2] == "E"))
out = subprocess.run(["perf", "script", "-i", data, "--pid", pid, "-G", "-F", "ip,dso"], capture_output=True, text=True).stdout
total = 0; kinds = collections.Counter(); addrs = collections.Counter()
for l in out.splitlines():
    f = l.split()
    if len(f) < 2: continue
    total += 1
    ip = int(f[0], 16); dso = f[1].strip("()")
    if dso == binary and base and base[0] <= ip < base[0] + base[1]:
        addrs[ip - base[0] + base[2] + delta] += 1
    elif "kernel" in dso: kinds["kernel"] += 1
    else: kinds["other user (" + dso.split("/")[-1] + ")"] += 1
uniq = sorted(addrs)
a2l = subprocess.run(["addr2line", "-a", "-i", "-e", binary] + [hex(a) for a in uniq], capture_output=True, text=True).stdout.splitlines()
chains = collections.defaultdict(list); cur = None
for l in a2l:
    if l.startswith("0x"): cur = int(l, 16); continue
    if cur is not None: chains[cur].append(l)
# The innermost frame that is not the standard library's (which is inlined everywhere).
inner = {a: next((l for l in c if "/rustc/" not in l), c[0]) for a, c in chains.items()}
def kind(path):
    m = re.search(r"runtime/src/(\w+)\.rs", path)
    if m:
        return "runtime machinery: " + m[1] if m[1] in ("executor", "coro_store", "job", "run_queue", "worker", "stack_pool", "counters", "loop_cell", "task", "join", "co", "resume", "fast_paths", "sched", "spawn") else "runtime I/O: " + m[1]
    if "corosensei" in path: return "runtime machinery: corosensei"
    if "io-uring" in path: return "io-uring crate"
    m = re.search(r"/work/[^/]+/(\w+)/", path)
    if m: return "ours: " + m[1]
    if "/rustc/" in path: return "std/core/alloc (inlined somewhere)"
    return "other in binary: " + path.split("/")[-1].split(":")[0]
fn = subprocess.run(["addr2line", "-f", "-e", binary] + [hex(a) for a in uniq], capture_output=True, text=True).stdout.splitlines()
func = {a: fn[2 * i] for i, a in enumerate(uniq)}
for a, n in addrs.items():
    k = kind(inner.get(a, "?"))
    # catch_unwind's landing function around the loop's resume has no line of its own
    if func.get(a) == "__rust_try" and "runtime" in inner.get(a, ""):
        k = "runtime machinery: __rust_try (catch_unwind around resume)"
    kinds[k] += n
mach = sum(n for k, n in kinds.items() if k.startswith("runtime machinery"))
print(f"daemon samples {total}; coroutine machinery {mach} = {100*mach/total:.2f}%")
for k, n in kinds.most_common(): print(f"  {100*n/total:6.2f}%  {n:6d}  {k}")
# With TOP=N in the environment: the N sampled lines of machinery with the most samples.
import os
top = int(os.environ.get("TOP", "0"))
if top:
    lines = collections.Counter()
    for a, n in addrs.items():
        if kind(inner.get(a, "?")).startswith("runtime machinery") or func.get(a) == "__rust_try":
            lines[inner.get(a, "?").split("/")[-1] + " in " + func.get(a, "?")[:60]] += n
    for l, n in lines.most_common(top): print(f"  {100*n/total:6.2f}%  {n:6d}  {l}")
