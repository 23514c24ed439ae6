#!/usr/bin/env bash
# GC freeze A/B on the adaptive engine: ctx 4k, bs 1,2,4 (the cell whose adaptive step lost 0.5 ms of "other" twice)
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 --version > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
for v in nofreeze freeze; do
  if [ $v = nofreeze ]; then cp specdec/bench/synthetic.py /tmp/synthetic.py; cp .stash/nofreeze/specdec/bench/synthetic.py specdec/bench/synthetic.py; fi
  timeout 220 python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len 4096 --batch-sizes 1,2,4 \
    --configs "6,8,32" --decode-steps 360 --warmup-steps 2 --speculative-draft-model-quantization fp8 \
    --speculative-draft-kv-cache-dtype fp8_e4m3 --output "$OUT/gc_$v.json" > "$OUT/gc_$v.log" 2>&1
  [ $v = nofreeze ] && cp /tmp/synthetic.py specdec/bench/synthetic.py
  grep -E "engine built|bs=" "$OUT/gc_$v.log" | sed "s/^/$v /"
done
