#!/usr/bin/env bash
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/t"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
F="--speculative-draft-model-quantization fp8"
timeout 150 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,32" --batch-sizes 1 --skip-adaptive \
  --context-len 1024 --decode-steps 4 --warmup-steps 2 $F --profile-device "$OUT/t/p1.txt" --profile-trace "$OUT/t" \
  --output "$OUT/t/o1.json" > "$OUT/t/l1.log" 2>&1; echo rc=$?
timeout 150 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "3,1,4" --batch-sizes 1,64 --skip-adaptive \
  --context-len 1024 --decode-steps 4 --warmup-steps 2 $F --profile-device "$OUT/t/p2.txt" --profile-trace "$OUT/t/c" \
  --output "$OUT/t/o2.json" > "$OUT/t/l2.log" 2>&1; echo rc=$?
ls -la "$OUT/t" "$OUT/t/c"; tar -C "$OUT" -cf "$OUT/traces.tar" t && rm -rf "$OUT/t"
