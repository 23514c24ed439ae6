#!/usr/bin/env bash
# W8A8 draft GEMMs, call 2 (after call 1: fp32 accumulation, W8A8 only where it pays, the zero row's
# scale a normal fp32, the e4m3 conversion rounding to nearest even): the GPU tests, whole decode
# steps with the FP8 draft before (main: W8A16 up to 16 tokens, then the 16-bit weights) and after
# (W8A8 past 16 tokens where it pays), one after the other on the same GPU, then the GEMMs alone
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
{ date -u; echo "commit $(cat .commit) + working tree"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$R/env.txt"
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider tests/models/test_gemv.py tests/models/test_draft_quantization.py \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "^FAILED|^E  .*differ|^E  .*error|passed|failed" "$R/gpu_tests.log" | tail -n 12
AB_CONFIGS="3,1,4;5,4,8;6,8,32" AB_BS=2,4,8,16,32,64 AB_TIMEOUT=190 AB_STEPS=32 \
  AB_ARGS="--speculative-draft-model-quantization fp8" OUT="$R/ab" bash scripts/gpu_ab.sh main=.stash/main w8a8=.
timeout 120 python3 benchmarks/bench_draft_gemm.py --output-dir "$R" --tokens 17,32,64,128,256 > "$R/draft_gemm.log" 2>&1
echo "bench rc=$?"; cut -c1-240 "$R/draft_gemm.log"
