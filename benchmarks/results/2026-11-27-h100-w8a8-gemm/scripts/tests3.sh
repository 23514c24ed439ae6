#!/usr/bin/env bash
# The CUDA-graph and lossless GPU suites in full at HEAD (the draft graphs own the DraftState).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env_tests3.txt
t0=$SECONDS
timeout 540 python3 -m pytest -m gpu -v -p no:cacheprovider -p no:warnings --durations=10 \
  tests/e2e/test_gpu_cuda_graphs.py tests/e2e/test_gpu_lossless.py > $OUT/gpu_tests3.log 2>&1
echo "pytest rc=$? $((SECONDS-t0)) s"; grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests3.log | tail -8
