"""One decode step's kernels from a `specdec bench --synthetic ... --profile-trace` Chrome trace: the
kernels between the second and third tree walks (`_walk_kernel`): per kernel its index, start (us
from the step's first kernel), duration, gap since the previous kernel ended, name.

    python step_timeline.py TRACE.json.gz > step.txt
"""
import gzip
import json
import sys

trace = json.load(gzip.open(sys.argv[1]))
kernels = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                                "gpu_memset")),
                 key=lambda e: e["ts"])
walks = [i for i, e in enumerate(kernels) if e["name"] == "_walk_kernel"]
step = kernels[walks[1] + 1: walks[2] + 1]
t0 = prev_end = step[0]["ts"]
total = {}
for i, e in enumerate(step):
    print(f"{i:4d} {e['ts'] - t0:9.1f} {e['dur']:7.1f} {e['ts'] - prev_end:6.1f} {e['name'][:90]}")
    prev_end = e["ts"] + e["dur"]
    total[e["name"][:60]] = total.get(e["name"][:60], 0.0) + e["dur"]
print(f"# {len(step)} kernels, {prev_end - t0:.1f} us from the first kernel's start to the last one's end")
for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:25]:
    print(f"# {us:9.1f} us  {name}")
