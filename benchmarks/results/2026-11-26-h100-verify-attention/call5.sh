#!/usr/bin/env bash
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
timeout 280 python3 .stash/mb/mb_attn.py "$OUT/mb_attn.json" 2>&1 | tee "$OUT/mb_attn.log" | grep -v Warn
echo "attn rc=${PIPESTATUS[0]}"
timeout 280 python3 .stash/mb/mb_gemv.py "$OUT/mb_gemv.json" 2>&1 | tee "$OUT/mb_gemv.log" | grep -v Warn
echo "gemv rc=${PIPESTATUS[0]}"
