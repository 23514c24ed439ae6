#!/usr/bin/env bash
# One call: the replay kernels' and the replayed engine's GPU tests, then an A/B at ctx 4096 of the
# replay's cost: bc77d99's replay (old), the fused ops (new), and the hazards draw (no replay).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/eagle/test_replay.py \
  tests/kernels/test_triton_ops.py -k "replay or opcheck or dispatch" > $OUT/gpu_tests.log 2>&1
echo "pytest rc=$?" >> $OUT/gpu_tests.log; tail -3 $OUT/gpu_tests.log
AB_CONFIGS="6,8,32;3,2,4" AB_BS="1,64" AB_CTX=4096 AB_STEPS=48 AB_TIMEOUT=150 \
  AB_ARGS="--speculative-draft-model-quantization fp8" AB_ARGS_hazards="--acceptance-model hazards" \
  bash scripts/gpu_ab.sh old=.stash/old new=. hazards=.
