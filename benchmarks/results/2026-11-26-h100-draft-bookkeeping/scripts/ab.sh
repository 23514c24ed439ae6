#!/usr/bin/env bash
# the changed kernels' GPU tests, then a whole-step A/B: HEAD's files (base) against the tree (new),
# twice each, interleaved
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
timeout 150 python3 -m pytest -p no:cacheprovider -m gpu -x tests/kernels/test_triton_ops.py tests/models/test_topk.py \
  -k "build_tree or frontier or draft_nodes or argmax or reconstruct" 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
export AB_CONFIGS="6,8,64;6,8,32;3,1,4" AB_BS="1,64" AB_CTX=1024 AB_STEPS=32 AB_TIMEOUT=110
bash scripts/gpu_ab.sh base=.stash/base_s6 new=. base2=.stash/base_s6 new2=. 2>&1 | tee "$OUT/ab.txt"
