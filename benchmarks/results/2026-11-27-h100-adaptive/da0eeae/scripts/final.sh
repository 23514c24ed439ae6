#!/usr/bin/env bash
# One context of the #16 sweep, then (TESTS=1) the GPU tests of the FP8-tile and draft-attention change.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SPECDEC_COMMIT=$(cat .commit)
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
bash .stash/sweep.sh > "$OUT/sweep$CTX.out" 2>&1
grep -A14 "^| ctx" "$OUT/sweep$CTX.out" | tail -14
grep -E "engine built|bs= 64" "$OUT/synthetic_ctx$CTX.log"
if [ "${TESTS:-0}" = 1 ]; then
  timeout "${TESTS_TIMEOUT:-280}" python3 -m pytest -m gpu -p no:cacheprovider -v --durations=10 \
    tests/attention/test_triton_backend.py tests/attention/test_store_kv.py tests/e2e/test_draft_kv_fp8.py \
    -k "fp8 or draft or clamped" > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc $?"; grep -cE "PASSED" "$OUT/gpu_tests.log"; grep -E "FAILED|passed|failed" "$OUT/gpu_tests.log" | tail -5
fi
