#!/usr/bin/env bash
# GPU tests of the skinny GEMM (swap-AB tiles), then an A/B against the previous table (FP8 draft both)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit)" >> "$R/env.txt"
timeout 150 python3 -m pytest -m gpu -x -p no:cacheprovider tests/models/test_gemv.py > "$R/gpu_tests_gemv.log" 2>&1
echo "gemv tests rc=$?"; tail -n 2 "$R/gpu_tests_gemv.log"
AB_CONFIGS="6,8,32;5,4,8;3,1,4" AB_BS=1,2,4,8,16,32 AB_TIMEOUT=190 AB_STEPS=32 \
  AB_ARGS="--speculative-draft-model-quantization fp8" OUT="$R/ab" bash scripts/gpu_ab.sh before=.stash/base3 now=.
tar -C "$OUT" -czf "$OUT/call22.tgz" r && rm -rf "$R"
