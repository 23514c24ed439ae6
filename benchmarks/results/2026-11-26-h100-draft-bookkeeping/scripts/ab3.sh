#!/usr/bin/env bash
# whole-step A/B: s0 = the session's start (a4a7f47), s1 = 6cc110a (bookkeeping kernels, argmax, fp32 logits),
# new = the tree (the merge's heads a program, the id map in the top-k); then a profile of 6x8x64 at bs 1
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/t"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"; cat .commit >> "$OUT/env.txt"
timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -x tests/models/test_topk.py tests/attention/test_triton_backend.py \
  -k "topk or argmax or graph_replay or decode_bs8 or verify" 2>&1 | tail -4 | tee "$OUT/gpu_quick.log"
export AB_CONFIGS="6,8,64;6,8,32;3,1,4" AB_BS="1,64" AB_CTX=1024 AB_STEPS=32 AB_TIMEOUT=100
bash scripts/gpu_ab.sh new=. s0=.stash/s0 s1=.stash/s1 new2=. s0b=.stash/s0 s1b=.stash/s1 2>&1 | tee "$OUT/ab.txt"
timeout 100 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,64" --batch-sizes 1 --skip-adaptive \
  --context-len 1024 --decode-steps 4 --warmup-steps 2 --profile-device "$OUT/t/p1.txt" --profile-trace "$OUT/t" \
  --output "$OUT/t/o1.json" > "$OUT/t/l1.log" 2>&1; echo rc=$?
tar -C "$OUT" -czf "$OUT/prof.tgz" t && rm -rf "$OUT/t"
mkdir -p "$OUT/logs" && mv "$OUT"/ab_*.log "$OUT"/ab_*.json "$OUT/logs/" && tar -C "$OUT" -czf "$OUT/ab_logs.tgz" logs && rm -rf "$OUT/logs"
