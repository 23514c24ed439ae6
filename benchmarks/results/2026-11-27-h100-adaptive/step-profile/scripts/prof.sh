#!/usr/bin/env bash
# One call: kernel profiles of the open cell (bs 64, ctx 1 k: plain, 3x2x4, 3x1x4) and of the
# bs-1 ctx-4k tree plans (main vs 4a43fa2's small tiles).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
timeout 200 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "3,2,4;3,1,4" --batch-sizes 64 \
  --skip-adaptive --context-len 1024 --decode-steps 16 --warmup-steps 2 \
  --speculative-draft-model-quantization fp8 --profile-device $OUT/prof_bs64.txt --output $OUT/prof_bs64.json \
  > $OUT/prof_bs64.log 2>&1; echo "bs64 rc=$?"; grep -E "bs=" $OUT/prof_bs64.log
OUT=$OUT bash benchmarks/results/2026-11-26-h100-adaptive/0272f8e/verify-streaming/tree-tiles-rejected/next_profile.sh
