#!/usr/bin/env bash
# GPU tests of select_frontier (and graph replay / lossless with it), then an A/B against 49cb527's files (FP8 draft both)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit)" >> "$R/env.txt"
timeout 280 python3 -m pytest -m gpu -x -p no:cacheprovider tests/kernels/test_triton_ops.py -k "frontier or opcheck or simulate" \
  > "$R/gpu_tests_kernels.log" 2>&1
echo "kernel tests rc=$?"; tail -n 3 "$R/gpu_tests_kernels.log"
timeout 200 python3 -m pytest -m gpu -x -p no:cacheprovider tests/e2e/test_gpu_cuda_graphs.py tests/e2e/test_gpu_lossless.py \
  > "$R/gpu_tests_e2e.log" 2>&1
echo "e2e tests rc=$?"; tail -n 3 "$R/gpu_tests_e2e.log"
AB_CONFIGS="6,8,32;5,4,8;3,1,4" AB_BS=1,8,64 AB_TIMEOUT=140 AB_STEPS=32 \
  AB_ARGS="--speculative-draft-model-quantization fp8" OUT="$R/ab" bash scripts/gpu_ab.sh before=.stash/base2 now=.
tar -C "$OUT" -czf "$OUT/call17.tgz" r && rm -rf "$R"
