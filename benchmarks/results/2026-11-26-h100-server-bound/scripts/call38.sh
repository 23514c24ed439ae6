#!/usr/bin/env bash
# balanced splits (branch, .stash/bal2) against main under a server's bound (131072: Llama-3.1's context
# length), the default attention cases and trees of 32-64 nodes at bs 2-16; then the branch's GPU tests
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
t0=$SECONDS
cp .stash/bal2/benchmarks/bench_attention.py benchmarks/bench_attention.py   # the branch's script: more case flags
bench() {  # $1 = output name
  timeout 100 python3 benchmarks/bench_attention.py --backends triton --static-bound 131072 --iters 20 --output-dir "$OUT/$1_default" > /dev/null 2>&1
  timeout 100 python3 benchmarks/bench_attention.py --backends triton --static-bound 131072 --iters 20 --batch-sizes 2 4 8 16 \
    --contexts 1024 4096 --tree-sizes 32 64 --output-dir "$OUT/$1_trees" > /dev/null 2>&1
  echo "$1 done $((SECONDS-t0))s"
}
bench main
cp -r .stash/bal2/. .
bench branch
timeout 330 python3 -m pytest -m gpu -p no:cacheprovider tests/attention/test_triton_backend.py tests/e2e/test_gpu_cuda_graphs.py \
  tests/e2e/test_gpu_lossless.py > "$OUT/gpu_tests_branch.log" 2>&1; echo "tests rc=$? $((SECONDS-t0))s"; tail -3 "$OUT/gpu_tests_branch.log"
git checkout -- specdec tests benchmarks
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for part in ("default", "trees"):
    try:
        a = json.load(open(f"{out}/main_{part}/bench_attention.json"))["rows"]
        b = json.load(open(f"{out}/branch_{part}/bench_attention.json"))["rows"]
    except Exception as e:
        print(part, "missing", e); continue
    for x, y in zip(a, b):
        print(x["mode"], x["bs"], x["context"], x["num_draft_tokens"], "graph us main", round(x["us"]["triton_graph"], 1),
              "branch", round(y["us"]["triton_graph"], 1), "floor", round(x.get("floor_us", 0), 1))
PY
cd "$OUT" && tar czf ../call38.tgz . && mv ../call38.tgz .
