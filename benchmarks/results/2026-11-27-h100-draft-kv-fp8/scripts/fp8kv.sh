#!/usr/bin/env bash
# FP8 draft KV cache: its GPU tests, then an A/B in whole 8B decode steps (FP8 draft weights both ways).
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
python3 -m pytest -m gpu -q -p no:cacheprovider tests/attention/test_store_kv.py tests/attention/test_triton_backend.py \
  tests/e2e/test_draft_kv_fp8.py tests/models/test_draft_quantization.py 2>&1 | tail -25 > "$OUT/gpu_tests.log"
python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_cache_ops.py -k move 2>&1 | tail -5 >> "$OUT/gpu_tests.log"
echo "tests took $(( $(date +%s) - t0 )) s" >> "$OUT/gpu_tests.log"; tail -8 "$OUT/gpu_tests.log"
AB_ARGS="--speculative-draft-model-quantization fp8" AB_ARGS_fp8kv="--speculative-draft-kv-cache-dtype fp8_e4m3" \
AB_CONFIGS="${CONFIGS:-3,1,4;3,2,4}" AB_BS="${BS:-1,32,64}" AB_STEPS="${STEPS:-96}" AB_CTX="${CTX:-1024}" AB_TIMEOUT=240 \
  bash scripts/gpu_ab.sh base=. fp8kv=. 2>&1 | tee "$OUT/ab.txt"
echo "total $(( $(date +%s) - t0 )) s"
