#!/usr/bin/env bash
# adaptive sweep, ctx 1024, fixed shapes 3x1x4 / 5x4x8 / 6x8x32 / 6x8x48, adaptive bounded by 6x8x48 --speculative-draft-model-quantization fp8
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
SYNTHETIC_ARGS="--configs 3,1,4;5,4,8;6,8,32;6,8,48 --speculative-draft-model-quantization fp8" DECODE_STEPS=64 ADAPTIVE_TESTS=0 ADAPTIVE_CTX=1024 OUT="$R" timeout 580 bash scripts/gpu_suite.sh adaptive
echo "suite rc=$?"
tar -C "$OUT" -czf "$OUT/call34.tgz" r && rm -rf "$R"
