#!/usr/bin/env bash
# microbench: GEMMs of 128-512 tokens (cuBLAS vs Triton TMA tiles / persistent / swap-AB), then tree-verify attention query tiles
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 330 python3 .stash/mb/mb_gemm256.py "$OUT/mb_gemm256.json" > "$OUT/mb_gemm256.log" 2>&1
echo "gemm rc=$?"; grep -v " ERR " "$OUT/mb_gemm256.log" | tail -20; echo "ERR lines: $(grep -c ' ERR ' $OUT/mb_gemm256.log)"; grep " ERR " "$OUT/mb_gemm256.log" | head -5
timeout 200 python3 .stash/mb/mb_attn2.py "$OUT/mb_attn2.json" > "$OUT/mb_attn2.log" 2>&1
echo "attn rc=$?"; tail -20 "$OUT/mb_attn2.log"
cd "$OUT" && tar czf ../call27.tgz . && mv ../call27.tgz .
