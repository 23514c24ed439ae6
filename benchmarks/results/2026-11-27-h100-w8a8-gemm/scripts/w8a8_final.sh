#!/usr/bin/env bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name --format=csv,noheader; } > $OUT/env_final.txt
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:warnings tests/models/test_w8a8_gemm.py \
  tests/models/test_draft_quantization.py > $OUT/gpu_tests_final.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/gpu_tests_final.log
