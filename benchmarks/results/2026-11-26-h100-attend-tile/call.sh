#!/usr/bin/env bash
# The attention kernels' shared tile step (attend_tile) re-applied: the triton backend's and the end-to-end
# lossless GPU tests, then whole decode steps before (.stash/pre: the three kernels with the step inlined)
# and after, one after the other on the same GPU
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$R/env.txt"
timeout 270 python3 -m pytest -m gpu -p no:cacheprovider tests/attention/test_triton_backend.py tests/e2e/test_gpu_lossless.py \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^FAILED|passed|failed" "$R/gpu_tests.log" | tail -n 6
AB_CONFIGS="3,1,4;6,8,32" AB_BS=1,16,64 AB_CTX=4096 AB_TIMEOUT=150 AB_STEPS=32 \
  AB_ARGS="--speculative-draft-model-quantization fp8" OUT="$R/ab" bash scripts/gpu_ab.sh pre=.stash/pre attend_tile=.
