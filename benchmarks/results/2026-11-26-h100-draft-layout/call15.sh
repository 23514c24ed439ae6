#!/usr/bin/env bash
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit)" >> "$R/env.txt"
timeout 280 python3 -m pytest -m gpu -x -p no:cacheprovider tests/kernels/test_cache_ops.py tests/e2e/test_gpu_cuda_graphs.py \
  tests/e2e/test_gpu_lossless.py --durations=3 > "$R/gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -n 6 "$R/gpu_tests.log"
AB_BS=1,4,64 AB_TIMEOUT=110 AB_STEPS=32 OUT="$R/ab" bash scripts/gpu_ab.sh before=.stash/before layout=.
tar -C "$OUT" -czf "$OUT/call15.tgz" r && rm -rf "$R"
