#!/usr/bin/env bash
# One call: GPU tests of the split-K W8A8 GEMM and of the draft graphs that own the DraftState, then an
# A/B of e6d209e's files (old) against the tree (new) in whole steps: new, old, new again.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit) (old: e6d209e's files)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
t0=$SECONDS
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:warnings tests/e2e/test_gpu_cuda_graphs.py \
  tests/e2e/test_gpu_lossless.py tests/models/test_draft_quantization.py tests/models/test_w8a8_gemm.py \
  tests/e2e/test_draft_kv_fp8.py > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$? $((SECONDS-t0)) s"; tail -4 $OUT/gpu_tests.log
AB_CONFIGS="3,2,4;5,4,8" AB_BS="8,16,32,64" AB_CTX=1024 AB_STEPS=96 AB_TIMEOUT=200 \
  AB_ARGS="--speculative-draft-model-quantization fp8 --speculative-draft-kv-cache-dtype fp8_e4m3" \
  bash scripts/gpu_ab.sh new=. old=.stash/old new2=. 2>&1 | grep -v "^\s*$"
