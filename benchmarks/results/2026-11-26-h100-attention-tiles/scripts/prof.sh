#!/usr/bin/env bash
# Kernel timelines of the two cells #16 still misses: 3x1x4 at bs 64, ctx 1 k, and 6x8x64 at bs 1, ctx 4 k
# (16-bit draft). Writes $OUT/step_*.txt (step_timeline.py) and the raw profiles and traces in traces.tgz.
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/t"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
timeline=benchmarks/results/2026-11-26-h100-draft-bookkeeping/scripts/step_timeline.py
run() {  # NAME CONFIG BS CTX
  timeout 240 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "$2" --batch-sizes "$3" --skip-adaptive \
    --context-len "$4" --decode-steps 6 --warmup-steps 2 --profile-device "$OUT/t/$1.txt" --profile-trace "$OUT/t/$1" \
    --output "$OUT/t/$1.json" > "$OUT/t/$1.log" 2>&1; echo "$1 rc=$?"
  grep -E "ms/step|x plain|speedup" "$OUT/t/$1.log" | tail -4
  for tr in "$OUT/t/$1"/*.json.gz; do
    case "$tr" in *plain*) continue;; esac
    python3 "$timeline" "$tr" > "$OUT/step_$1.txt"; tail -26 "$OUT/step_$1.txt"
  done
}
run chain_bs64_1k "3,1,4" 64 1024
run tree64_bs1_4k "6,8,64" 1 4096
tar czf "$OUT/traces.tgz" -C "$OUT" t && rm -rf "$OUT/t"
