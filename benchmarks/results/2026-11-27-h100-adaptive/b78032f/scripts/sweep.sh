#!/usr/bin/env bash
# One context of the issue #16 sweep (240 timed tokens a request): bash .stash/sweep.sh CTX
export PYTHONPATH=$PWD
SYNTHETIC_ARGS="--speculative-draft-model-quantization fp8 --configs 3,1,4;5,4,8;6,8,32;6,8,64" \
  DECODE_STEPS=240 ADAPTIVE_TESTS=0 ADAPTIVE_CTX=$1 bash scripts/gpu_suite.sh adaptive
