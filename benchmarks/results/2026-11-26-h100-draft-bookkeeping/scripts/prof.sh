#!/usr/bin/env bash
# bs-1 step timeline at HEAD: 6x8x64 and 6x8x32, 16-bit draft, ctx 1024
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/t"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
timeout 240 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,64;6,8,32" --batch-sizes 1 --skip-adaptive \
  --context-len 1024 --decode-steps 4 --warmup-steps 2 --profile-device "$OUT/t/p1.txt" --profile-trace "$OUT/t" \
  --output "$OUT/t/o1.json" > "$OUT/t/l1.log" 2>&1; echo rc=$?
tail -20 "$OUT/t/l1.log"; ls -la "$OUT/t"
