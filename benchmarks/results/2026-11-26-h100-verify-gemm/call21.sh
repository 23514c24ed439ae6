#!/usr/bin/env bash
# microbench: GEMMs of 16-32 tokens on the 8B's weights: shipped tiling grid, swap-AB (pointer / TMA), cuBLAS
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 560 python3 .stash/mb/mb_gemm32.py "$OUT/mb_gemm32.json" 2>&1 | tee "$OUT/mb_gemm32.log" | grep -v " ERR " | tail -40
grep -c " ERR " "$OUT/mb_gemm32.log"
