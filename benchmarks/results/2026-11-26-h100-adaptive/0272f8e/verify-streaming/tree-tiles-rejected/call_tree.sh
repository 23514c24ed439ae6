#!/usr/bin/env bash
export PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/attention/test_triton_backend.py -k "matches_torch_native and verify" \
  > $OUT/gpu_attention_tests.log 2>&1; echo "pytest rc=$?" >> $OUT/gpu_attention_tests.log; tail -2 $OUT/gpu_attention_tests.log
AB_CONFIGS="6,8,32" AB_BS="1,2" AB_CTX=4096 AB_STEPS=32 AB_TIMEOUT=90 \
  AB_ARGS="--speculative-draft-model-quantization fp8" bash scripts/gpu_ab.sh pre=.stash/pre2 new=.
