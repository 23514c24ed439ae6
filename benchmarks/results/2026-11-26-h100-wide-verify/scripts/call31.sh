#!/usr/bin/env bash
# attribution: the tree twice (run-to-run spread) and the tree without PDL on the attention kernels
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit) + working tree" >> "$OUT/env.txt"
AB_CONFIGS="6,8,32;6,8,48;3,1,4" AB_BS="1,2,16" AB_STEPS=48 AB_TIMEOUT=180 OUT="$OUT" \
  bash scripts/gpu_ab.sh now1=. nopdl=.stash/nopdl now2=. 2>&1 | tee "$OUT/ab_summary.txt" | grep -v Speedup | tail -60
cd "$OUT" && tar czf ../call31.tgz . && mv ../call31.tgz .
