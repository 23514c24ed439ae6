#!/usr/bin/env bash
export PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/attention/test_triton_backend.py -k "matches_torch_native or forced_splits" \
  > $OUT/gpu_attention_tests.log 2>&1; echo "pytest rc=$?" >> $OUT/gpu_attention_tests.log; tail -2 $OUT/gpu_attention_tests.log
AB_CONFIGS="3,1,4;3,2,4;5,4,8" AB_BS="32,64,128" AB_CTX=1024 AB_STEPS=48 AB_TIMEOUT=150 \
  AB_ARGS="--speculative-draft-model-quantization fp8" bash scripts/gpu_ab.sh pre=.stash/pre new=.
