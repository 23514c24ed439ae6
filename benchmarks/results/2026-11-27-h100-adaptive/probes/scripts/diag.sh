#!/usr/bin/env bash
# Diagnosis: (1) verify-sized GEMMs, cuBLAS vs cuBLASLt; (2) ctx 4k, bs 1,2,4: plain, 6x8x32, 6x8x64,
# adaptive (bound 6x8x64, the sweep's candidate set), per-step spread, host and device profiles at bs 2.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
{ python3 --version; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; } > "$OUT/env.txt"
timeout 120 python3 .stash/gemm_probe.py > "$OUT/gemm_probe.log" 2>&1; tail -3 "$OUT/gemm_probe.log"
timeout 420 python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len 4096 --batch-sizes 1,2,4 \
  --configs "6,8,32;6,8,64" --decode-steps 360 --warmup-steps 2 --speculative-draft-model-quantization fp8 \
  --speculative-draft-kv-cache-dtype fp8_e4m3 --profile-batch-sizes 2 --profile-host "$OUT/host_bs2.txt" \
  --output "$OUT/diag_ctx4096.json" > "$OUT/diag_ctx4096.log" 2>&1
echo "rc $?"; grep -E "engine built|bs=" "$OUT/diag_ctx4096.log"
