#!/usr/bin/env bash
# A/B in whole steps: main (54e9bbd, .stash/base4) against the tree (swap-AB GEMMs to 64 tokens for wide weights,
# PDL on the triton attention kernels, 64-row tree-verify tiles for small grids)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit) + working tree" >> "$OUT/env.txt"
AB_CONFIGS="6,8,32;6,8,48;3,1,4" AB_BS="1,2,16,64" AB_STEPS=32 AB_TIMEOUT=280 OUT="$OUT" \
  bash scripts/gpu_ab.sh before=.stash/base4 now=. 2>&1 | tee "$OUT/ab_summary.txt" | tail -60
cd "$OUT" && tar czf ../call30.tgz . && mv ../call30.tgz .
