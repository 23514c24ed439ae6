#!/usr/bin/env bash
# microbench: GEMMs of 40-64 tokens (swap-AB tilings vs cuBLAS), chain-verify attention at large batch (KV tile / stages / warps)
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 300 python3 .stash/mb/mb_gemm64.py "$OUT/mb_gemm64.json" > "$OUT/mb_gemm64.log" 2>&1
echo "gemm rc=$?"; grep -v " ERR " "$OUT/mb_gemm64.log" | tail -20; echo "ERR lines: $(grep -c ' ERR ' $OUT/mb_gemm64.log)"; grep " ERR " "$OUT/mb_gemm64.log" | head -3
timeout 200 python3 .stash/mb/mb_attn3.py "$OUT/mb_attn3.json" > "$OUT/mb_attn3.log" 2>&1
echo "attn rc=$?"; tail -12 "$OUT/mb_attn3.log"
cd "$OUT" && tar czf ../call29.tgz . && mv ../call29.tgz .
