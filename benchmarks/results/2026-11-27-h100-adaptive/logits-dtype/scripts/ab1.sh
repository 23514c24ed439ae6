#!/usr/bin/env bash
# One call: the GPU lossless and CUDA-graph suites with the verify's and draft's logits in the
# model dtype, then an A/B against HEAD's files (old) in whole steps.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit) + working tree"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
AB_CONFIGS="3,2,4;6,8,32" AB_BS="1,64" AB_CTX=1024 AB_STEPS=48 AB_TIMEOUT=150 \
  AB_ARGS="--speculative-draft-model-quantization fp8" bash scripts/gpu_ab.sh old=.stash/old new=.
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/e2e/test_gpu_lossless.py tests/e2e/test_gpu_cuda_graphs.py \
  tests/models/test_llama_model.py tests/models/test_gemv.py > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; tail -3 $OUT/gpu_tests.log
