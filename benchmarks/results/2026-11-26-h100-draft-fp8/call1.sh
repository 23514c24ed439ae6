#!/usr/bin/env bash
# call 1: draft-fp8 GPU tests + A/B main vs fp8 (branch tree with the flag)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 170 python3 -m pytest -q -m gpu tests/models/test_gemv.py tests/models/test_draft_quantization.py -x -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -n 15 "$OUT/gpu_tests.log"
AB_BS="${AB_BS:-1,4,8,32}" AB_TIMEOUT=190 AB_STEPS=24 AB_ARGS_fp8="--speculative-draft-model-quantization fp8" \
  bash scripts/gpu_ab.sh main=.stash/main fp8=.
tar -C "$OUT" -czf "$OUT/../call1.tgz" . && mv "$OUT/../call1.tgz" "$OUT/"
