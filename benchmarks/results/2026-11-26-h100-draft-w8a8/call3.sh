#!/usr/bin/env bash
# W8A8 draft GEMMs, call 3: the diagnostic, then the tests again (scale as a product with fp32(1/448))
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/results/2026-11-26-h100-draft-w8a8/diag.py 2>&1 | tee "$R/diag.log"
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider tests/models/test_gemv.py -k "fp8 or quantize" \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^FAILED|^E  .*differ|^E  .*error|passed|failed" "$R/gpu_tests.log" | tail -n 12
