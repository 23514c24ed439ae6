#!/usr/bin/env bash
# exploration: GEMMs at 192-256 rows (cuBLAS / cuBLASLt / grouped_mm / Triton split-K), the bs-64 chain step
# kernel by kernel, and the balanced-splits attention branch against main under a server's bound
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
t0=$SECONDS
timeout 220 python3 .stash/mb/mb_ridge.py "$OUT/mb_ridge.json" > "$OUT/mb_ridge.log" 2>&1
echo "ridge rc=$? $((SECONDS-t0))s"; grep -v " ERR " "$OUT/mb_ridge.log" | tail -14; echo "ERR lines: $(grep -c ' ERR ' $OUT/mb_ridge.log)"; grep " ERR " "$OUT/mb_ridge.log" | head -4
timeout 150 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "3,1,4;2,1,3" --batch-sizes 64 --skip-adaptive \
  --context-len 1024 --decode-steps 16 --warmup-steps 2 --profile-device "$OUT/prof_bs64.txt" --output "$OUT/prof_bs64.json" > "$OUT/prof_bs64.log" 2>&1
echo "profile rc=$? $((SECONDS-t0))s"; grep -E "^(plain|[0-9])" "$OUT/prof_bs64.log" | tail -6
for bound in 32768 1600; do
  timeout 75 python3 benchmarks/bench_attention.py --backends triton --static-bound $bound --iters 20 --output-dir "$OUT/main_$bound" > /dev/null 2>&1
done
cp -r .stash/balanced/. .
for bound in 32768 1600; do
  timeout 75 python3 benchmarks/bench_attention.py --backends triton --static-bound $bound --iters 20 --output-dir "$OUT/branch_$bound" > /dev/null 2>&1
done
git checkout -- specdec tests
echo "attention done $((SECONDS-t0))s"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for bound in (32768, 1600):
    try:
        a = json.load(open(f"{out}/main_{bound}/bench_attention.json"))["rows"]
        b = json.load(open(f"{out}/branch_{bound}/bench_attention.json"))["rows"]
    except Exception as e:
        print(bound, "missing", e); continue
    for x, y in zip(a, b):
        print(bound, x["mode"], x["bs"], x["context"], x["num_draft_tokens"], "graph us main", round(x["us"]["triton_graph"], 1),
              "branch", round(y["us"]["triton_graph"], 1))
PY
cd "$OUT" && tar czf ../call37.tgz . && mv ../call37.tgz .
