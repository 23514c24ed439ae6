#!/usr/bin/env bash
# whole-step A/B: HEAD's files (base) against the tree (new), twice each, interleaved; then a profile of 6x8x64 at bs 1
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/t"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
export AB_CONFIGS="6,8,64;6,8,32;3,1,4" AB_BS="1,64" AB_CTX=1024 AB_STEPS=32 AB_TIMEOUT=100
bash scripts/gpu_ab.sh new=. base=.stash/base_s6 new2=. base2=.stash/base_s6 2>&1 | tee "$OUT/ab.txt"
timeout 100 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,64" --batch-sizes 1 --skip-adaptive \
  --context-len 1024 --decode-steps 4 --warmup-steps 2 --profile-device "$OUT/t/p1.txt" --profile-trace "$OUT/t" \
  --output "$OUT/t/o1.json" > "$OUT/t/l1.log" 2>&1; echo rc=$?
