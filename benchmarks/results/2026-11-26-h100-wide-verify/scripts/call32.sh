#!/usr/bin/env bash
# GPU tests of this change: the skinny GEMM at 1-64 tokens on the 8B shapes, the triton attention kernels
# (PDL, 64-row tiles) against their references, CUDA-graph replay equals eager, speculative greedy equals plain
# greedy, adaptive switching under graphs
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 560 python3 -m pytest -m gpu -p no:cacheprovider tests/models/test_gemv.py tests/attention/test_triton_backend.py \
  tests/attention/test_store_kv.py tests/e2e/test_gpu_cuda_graphs.py tests/e2e/test_gpu_lossless.py tests/e2e/test_adaptive.py \
  --durations=5 > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -n 15 "$OUT/gpu_tests.log"
cd "$OUT" && tar czf ../call32.tgz . && mv ../call32.tgz .
