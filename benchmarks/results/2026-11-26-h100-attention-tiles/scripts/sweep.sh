#!/usr/bin/env bash
# Issue #16's sweep at one context (CTX, 1024 or 4096): plain, fixed 3x1x4 / 5x4x8 / 6x8x32 / 6x8x48 / 6x8x64 and
# adaptive bounded by 6x8x64, FP8 draft weights, 64 timed steps a point; then (ctx 1024) the lossless GPU tests
# with whatever time is left.
set -uo pipefail
CTX="${1:?context length}"
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export SPECDEC_COMMIT=$(cat .commit) PYTHONUNBUFFERED=1
t0=$SECONDS
SYNTHETIC_ARGS="--configs 3,1,4;5,4,8;6,8,32;6,8,48;6,8,64 --speculative-draft-model-quantization fp8" DECODE_STEPS=64 \
  ADAPTIVE_TESTS=0 ADAPTIVE_CTX="$CTX" OUT="$R" timeout 560 bash scripts/gpu_suite.sh adaptive
echo "suite rc=$? $((SECONDS-t0))s"
grep -E "engine built|adaptive speculation" "$R"/synthetic_ctx$CTX.log | head -20
tar -C "$OUT" -czf "$OUT/sweep_ctx$CTX.tgz" r && rm -rf "$R"
