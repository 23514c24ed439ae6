#!/usr/bin/env bash
# After the kernels' tile step became one shared jit helper (attend_tile): the kernel-vs-reference tests and
# the GPU backend cases on the H100, then the planner's own launch ("auto") of three cases of mb_attn_tiles.py
# (its variants pass a HEADS_FIRST switch the kernels no longer take, so they fail fast and are skipped).
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env_refactor.txt"; cat .commit >> "$OUT/env_refactor.txt"
timeout 300 python3 -m pytest -p no:cacheprovider -q tests/attention/test_triton_backend.py \
  -k "kernel_matches_ref or gpu_forced_splits or test_gpu_matches" > "$OUT/refactor_tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed" "$OUT/refactor_tests.log" | tail -2
timeout 120 python3 benchmarks/results/2026-11-26-h100-attention-tiles/scripts/mb_attn_tiles.py --out "$OUT" \
  --cases chain64_1k_new,decode64_1k,tree1_4k 2>&1 | grep -v Warning | cut -c1-120
