#!/usr/bin/env bash
# FP8 draft: GPU tests + A/B against main (same tree without the branch's files)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit)" >> "$R/env.txt"
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider tests/models/test_gemv.py tests/models/test_draft_quantization.py > "$R/gpu_fp8_tests.log" 2>&1
echo "fp8 tests rc=$?"; tail -n 3 "$R/gpu_fp8_tests.log"
AB_BS=1,2,4,8,16 AB_TIMEOUT=170 AB_STEPS=32 AB_ARGS_fp8="--speculative-draft-model-quantization fp8" OUT="$R/ab" \
  bash scripts/gpu_ab.sh main=.stash/main fp8=.
tar -C "$OUT" -czf "$OUT/call7.tgz" r && rm -rf "$R"
