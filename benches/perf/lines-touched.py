#!/usr/bin/env python3
"""lines-touched.py BIN CASE [ITERS]: the data cache lines one iteration of a `bench switch`
case touches, counted exactly: BIN (corofuse-lab) runs the case under valgrind's lackey, which traces every
load and store; a line accessed ITERS times or more (default 5000: at least once per
iteration on average) is counted in the case's per-iteration working set (an access that
straddles two lines counts for the first). Prints how many such lines there are,
then each, grouped by 1 MiB region, with its accesses per iteration.

What a system call costs a round trip afterwards grows with the lines it must fetch back
into the L1 (the kernel's own work evicts them), so this is the number to shrink when the
instruction count is already low (PROFILING.md, "Lines touched")."""
import collections, signal, subprocess, sys, tempfile

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`

binary, case = sys.argv[1], sys.argv[2]
iters = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
with tempfile.NamedTemporaryFile(suffix=".lackey") as log:
    subprocess.run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log.name}",
                    binary, "bench", "switch", "--raw", "--case", case, "--iters", str(iters)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = collections.Counter()
    with open(log.name) as trace:
        for l in trace:
            if l[:2] in (" L", " S", " M"):
                lines[int(l[3:].split(",")[0], 16) >> 6] += 1
hot = sorted((line, n) for line, n in lines.items() if n >= iters)
print(f"{case}: {len(hot)} lines touched per iteration, "
      f"{sum(n for _, n in hot) / iters:.1f} accesses to them per iteration")
region = None
for line, n in hot:
    if line >> 14 != region:
        region = line >> 14
        print(f"  region {hex(region << 20)}")
    print(f"    {hex(line << 6)}  {n / iters:5.1f}")
