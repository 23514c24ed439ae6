#!/usr/bin/env bash
# GPU tests at the session's last commit: adaptive switching, the replay (kernels, engine under
# graphs), then the CUDA-graph and lossless suites.
export PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env_gpu_tests.txt
timeout 280 python3 -m pytest -m gpu -x -p no:cacheprovider tests/e2e/test_adaptive.py tests/eagle/test_replay.py \
  tests/kernels/test_triton_ops.py -k "adaptive or replay or opcheck" > $OUT/gpu_tests_adaptive_replay.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests_adaptive_replay.log; tail -2 $OUT/gpu_tests_adaptive_replay.log
timeout 280 bash scripts/gpu_suite.sh graphs > /dev/null 2>&1; echo "graphs rc=$?" >> $OUT/gpu_graph_tests.log
tail -3 $OUT/gpu_graph_tests.log
