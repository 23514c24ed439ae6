#!/usr/bin/env bash
# One context of issue #16's sweep (FP8 draft weights and KV cache): CTX=1024|4096
set -uo pipefail
export PYTHONPATH=$PWD
SYNTHETIC_ARGS="--speculative-draft-model-quantization fp8 --speculative-draft-kv-cache-dtype fp8_e4m3 --configs 3,1,4;5,4,8;6,8,32;6,8,64" \
  ADAPTIVE_TESTS=0 ADAPTIVE_CTX="$CTX" bash scripts/gpu_suite.sh adaptive
