#!/usr/bin/env bash
# W8A8 draft GEMMs, call 1: their GPU tests, then the head's GEMMs alone (bench_draft_gemm.py)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; echo "commit $(cat .commit) + working tree"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$R/env.txt"
timeout 240 python3 -m pytest -m gpu -p no:cacheprovider tests/models/test_gemv.py tests/models/test_draft_quantization.py \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|Error" "$R/gpu_tests.log" | tail -n 15
timeout 300 python3 benchmarks/bench_draft_gemm.py --output-dir "$R" > "$R/draft_gemm.log" 2>&1
echo "bench rc=$?"; cat "$R/draft_gemm.log" | cut -c1-220
