#!/usr/bin/env bash
# adaptive sweep at ctx 4096 (fixed 3x1x4 / 5x4x8 / 6x8x32 / 6x8x48 / 6x8x64, adaptive bounded by 6x8x64), 64 steps a point
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export SPECDEC_COMMIT=$(cat .commit) PYTHONUNBUFFERED=1
SYNTHETIC_ARGS="--configs 3,1,4;5,4,8;6,8,32;6,8,48;6,8,64" DECODE_STEPS=64 ADAPTIVE_TESTS=0 ADAPTIVE_CTX=4096 OUT="$R" \
  timeout 575 bash scripts/gpu_suite.sh adaptive
echo "suite rc=$?"
tar -C "$OUT" -czf "$OUT/sweep4k.tgz" r && rm -rf "$R"
