#!/usr/bin/env bash
# bs 1, ctx 4 k: the trees with 16-bit and FP8 draft weights, one after the other in one call.
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
for q in bf16 fp8; do
  extra=(); [ "$q" = fp8 ] && extra=(--speculative-draft-model-quantization fp8)
  timeout 280 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,64;6,8,32" --batch-sizes 1 \
    --skip-adaptive --context-len 4096 --decode-steps 32 "${extra[@]}" --output "$OUT/fp8_4k_$q.json" \
    > "$OUT/fp8_4k_$q.log" 2>&1; echo "$q rc=$?"; tail -12 "$OUT/fp8_4k_$q.log"
done
