#!/usr/bin/env bash
# call 2: FP8 token threshold A/B (16 vs 32) + device profile of bs1 6x8x32 with the FP8 draft
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
echo "commit $(cat .commit)" > "$OUT/env.txt"; nvidia-smi --query-gpu=name --format=csv,noheader >> "$OUT/env.txt"
F="--speculative-draft-model-quantization fp8"
AB_BS=1,2,4,16,32 AB_TIMEOUT=150 AB_STEPS=24 AB_ARGS_fp8_16="$F" AB_ARGS_fp8_32="$F" \
  bash scripts/gpu_ab.sh main=.stash/main fp8_16=. fp8_32=.stash/fp8_32
for cfg in "6,8,32" "3,1,4"; do
  timeout 120 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "$cfg" --batch-sizes 1 --skip-adaptive \
    --context-len 1024 --decode-steps 16 --warmup-steps 2 $F --profile-device "$OUT/profile_${cfg//,/x}.txt" \
    --output "$OUT/profiled_${cfg//,/x}.json" > "$OUT/profiled_${cfg//,/x}.log" 2>&1; echo "profile $cfg rc=$?"
done
