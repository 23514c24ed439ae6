#!/usr/bin/env bash
# adaptive sweep at ctx 1024 (fixed 3x1x4 / 5x4x8 / 6x8x32 / 6x8x48 / 6x8x64, adaptive bounded by 6x8x64), then
# the trees and adaptive at bs 1-4 with the FP8 draft
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R/fp8"
export SPECDEC_COMMIT=$(cat .commit) PYTHONUNBUFFERED=1
t0=$SECONDS
SYNTHETIC_ARGS="--configs 3,1,4;5,4,8;6,8,32;6,8,48;6,8,64" DECODE_STEPS=64 ADAPTIVE_TESTS=0 ADAPTIVE_CTX=1024 OUT="$R" \
  timeout 400 bash scripts/gpu_suite.sh adaptive
echo "suite rc=$? $((SECONDS-t0))s"
tar -C "$OUT" -czf "$OUT/call39.tgz" r
left=$((575 - SECONDS + t0))
timeout $left python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len 1024 --batch-sizes 1,2,4 --decode-steps 64 \
  --warmup-steps 2 --configs "6,8,32;6,8,48;6,8,64" --speculative-draft-model-quantization fp8 \
  --output "$R/fp8/synthetic_ctx1024.json" > "$R/fp8/synthetic_ctx1024.log" 2>&1
echo "fp8 rc=$? $((SECONDS-t0))s"; grep -E "^(plain|[0-9a-z]|  bs)" "$R/fp8/synthetic_ctx1024.log" | tail -20
tar -C "$OUT" -czf "$OUT/call39.tgz" r && rm -rf "$R"
