#!/usr/bin/env bash
# One call: where the open cell's step (3x2x4, bs 64, ctx 1 k) leaves the GPU idle: host profile
# (cProfile of engine.step), then a device profile with its Chrome trace.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env.txt
common="--synthetic llama-3.1-8b --configs 3,2,4 --batch-sizes 64 --skip-adaptive --context-len 1024 --warmup-steps 2 --speculative-draft-model-quantization fp8"
timeout 200 python3 -m specdec.cli bench $common --decode-steps 32 --profile-host $OUT/host.txt \
  > $OUT/host.log 2>&1; echo "host rc=$?"; grep -E "bs=" $OUT/host.log
timeout 200 python3 -m specdec.cli bench $common --decode-steps 6 --profile-device $OUT/dev.txt --profile-trace $OUT/trace \
  > $OUT/dev.log 2>&1; echo "dev rc=$?"; grep -E "bs=" $OUT/dev.log; ls -la $OUT/trace
