#!/usr/bin/env bash
# larger trees at small batch: 6x8x32 / 6x6x48 / 6x8x48 / 6x8x64, bf16 draft, ctx 1024 (what a bigger tree costs in verify)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 560 python3 -m specdec.cli bench --synthetic llama-3.1-8b --device cuda --configs "6,8,32;6,8,48;6,8,64;6,6,48" \
  --batch-sizes 1,2,4 --skip-adaptive --context-len 1024 --decode-steps 32 --warmup-steps 2 \
  --output "$OUT/trees.json" > "$OUT/trees.log" 2>&1
echo "trees rc=$?"; tail -25 "$OUT/trees.log"
cd "$OUT" && tar czf ../call28.tgz . && mv ../call28.tgz .
