#!/usr/bin/env bash
# GPU tests of this session's kernels, then speculative greedy == plain greedy through the engine
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
timeout 200 python3 -m pytest -p no:cacheprovider -m gpu -x tests/models/test_gemv.py tests/models/test_topk.py \
  tests/kernels/test_triton_ops.py -k "fp32_logits or argmax or kernel_matches_ref_llama8b_shapes or build_tree or frontier or draft_nodes or reconstruct or graph_replay" \
  2>&1 | tail -8 | tee "$OUT/gpu_kernel_tests.log"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$OUT/gpu_kernel_tests.log"
timeout 330 python3 -m pytest -p no:cacheprovider -m gpu -x tests/e2e/test_gpu_lossless.py 2>&1 | tail -8 | tee "$OUT/gpu_lossless.log"
echo "pytest rc=${PIPESTATUS[0]}" | tee -a "$OUT/gpu_lossless.log"
