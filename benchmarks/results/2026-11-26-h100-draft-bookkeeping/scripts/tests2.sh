#!/usr/bin/env bash
# the triton attention backend's GPU tests (the merge of split partials runs in every split path) and adaptive's
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
timeout 380 python3 -m pytest -p no:cacheprovider -m gpu tests/attention/test_triton_backend.py > "$OUT/gpu_attention_tests.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/gpu_attention_tests.log"; tail -4 "$OUT/gpu_attention_tests.log"
timeout 150 python3 -m pytest -p no:cacheprovider -m gpu tests/e2e/test_adaptive.py > "$OUT/gpu_adaptive_tests.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/gpu_adaptive_tests.log"; tail -4 "$OUT/gpu_adaptive_tests.log"
