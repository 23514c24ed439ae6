#!/usr/bin/env bash
# adaptive sweep at ctx 1024 (fixed 3x1x4 / 5x4x8 / 6x8x32 / 6x8x48 / 6x8x64, adaptive bounded by 6x8x64), 64 steps a point
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export SPECDEC_COMMIT=$(cat .commit) PYTHONUNBUFFERED=1
t0=$SECONDS
SYNTHETIC_ARGS="--configs 3,1,4;5,4,8;6,8,32;6,8,48;6,8,64" DECODE_STEPS=64 ADAPTIVE_TESTS=0 ADAPTIVE_CTX=1024 OUT="$R" \
  timeout 420 bash scripts/gpu_suite.sh adaptive
echo "suite rc=$? $((SECONDS-t0))s"
left=$((580 - SECONDS + t0))
PYTHONPATH=$PWD timeout $left python3 -m pytest -p no:cacheprovider -m gpu -x tests/e2e/test_gpu_lossless.py > "$R/gpu_lossless.log" 2>&1
echo "lossless rc=$? $((SECONDS-t0))s" | tee -a "$R/gpu_lossless.log"; tail -3 "$R/gpu_lossless.log"
tar -C "$OUT" -czf "$OUT/sweep.tgz" r && rm -rf "$R"
