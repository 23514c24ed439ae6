#!/usr/bin/env bash
# One call: the replay kernels' GPU tests (e2043e0's clamps), then why the sweep's bs-64 verify is
# slower than the A/B's: the same tree and point (3x2x4, bs 64, ctx 1 k) in engines built for one
# batch size or eight, for 48 or 96 timed steps (the engine's context length follows the steps).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/eagle/test_replay.py \
  tests/kernels/test_triton_ops.py -k "replay or opcheck" > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; tail -2 $OUT/gpu_tests.log
all="1,2,4,8,16,32,64,128"
AB_CONFIGS="3,2,4" AB_BS="64" AB_CTX=1024 AB_TIMEOUT=200 AB_ARGS="--speculative-draft-model-quantization fp8" \
  AB_ARGS_one48="--decode-steps 48" AB_ARGS_one96="--decode-steps 96" \
  AB_ARGS_all48="--batch-sizes $all --decode-steps 48" AB_ARGS_all96="--batch-sizes $all --decode-steps 96" \
  bash scripts/gpu_ab.sh one48=. one96=. all48=. all96=.
