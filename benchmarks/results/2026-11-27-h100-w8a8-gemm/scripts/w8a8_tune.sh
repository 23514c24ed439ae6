#!/bin/bash
# Call 1: the split-K Triton W8A8 GEMM's GPU tests, then its tilings timed against torch._scaled_mm.
export PYTHONPATH=$PWD
echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
t0=$SECONDS
python -m pytest -q -p no:warnings -m gpu tests/models/test_w8a8_gemm.py tests/models/test_gemv.py -k "w8a8 or fp8 or quantize" \
  > $OUT/gpu_tests.log 2>&1; echo "tests rc=$? $((SECONDS-t0)) s"; tail -15 $OUT/gpu_tests.log
t0=$SECONDS
python benchmarks/bench_draft_gemm.py --tune --tokens ${TOKENS:-32,64,128,256} --output-dir $OUT > $OUT/tune.log 2>&1
echo "tune rc=$? $((SECONDS-t0)) s"; tail -30 $OUT/tune.log
