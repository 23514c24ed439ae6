#!/usr/bin/env bash
# GPU tests of the attention changes: the Triton backend's kernels, then greedy lossless and CUDA graphs end to end.
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env_tests.txt"; cat .commit >> "$OUT/env_tests.txt"
t0=$SECONDS
for t in tests/attention/test_triton_backend.py tests/e2e/test_gpu_lossless.py tests/e2e/test_gpu_cuda_graphs.py; do
  name=$(basename "$t" .py)
  timeout $((570 - SECONDS + t0)) python3 -m pytest -p no:cacheprovider -q -m gpu "$t" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"; tail -2 "$OUT/$name.log" | head -1
done
