#!/usr/bin/env bash
# The GPU tests the last call's timeout cut: FP8 drafts (W8A8 inside the captured draft extend), the
# split-K W8A8 GEMM at the table's tilings, the FP8 draft KV cache; then the lossless suite's tail.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env_tests.txt
t0=$SECONDS
timeout 420 python3 -m pytest -m gpu -v -p no:cacheprovider -p no:warnings --durations=10 tests/models/test_draft_quantization.py \
  tests/models/test_w8a8_gemm.py tests/e2e/test_draft_kv_fp8.py tests/models/test_gemv.py -k "not test_gpu_kernel_matches_ref_llama8b" \
  > $OUT/gpu_tests2.log 2>&1
echo "pytest rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests2.log | tail -8
