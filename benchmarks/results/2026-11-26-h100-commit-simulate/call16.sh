#!/usr/bin/env bash
# GPU tests of move_kv_slots / simulate_target_predict, then an A/B against 1ecc07c's files (FP8 draft both)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit)" >> "$R/env.txt"
timeout 250 python3 -m pytest -m gpu -x -p no:cacheprovider tests/kernels/test_cache_ops.py tests/kernels/test_triton_ops.py \
  tests/e2e/test_gpu_lossless.py tests/e2e/test_gpu_cuda_graphs.py --durations=3 > "$R/gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -n 8 "$R/gpu_tests.log"
AB_CONFIGS="6,8,32;5,4,8;3,1,4" AB_BS=1,8,64 AB_TIMEOUT=165 AB_STEPS=32 \
  AB_ARGS="--speculative-draft-model-quantization fp8" OUT="$R/ab" bash scripts/gpu_ab.sh before=.stash/base1 now=.
tar -C "$OUT" -czf "$OUT/call16.tgz" r && rm -rf "$R"
