#!/usr/bin/env bash
# whole decode steps under a server's CUDA-graph bound (--server-context-length 131072, Llama-3.1's context length):
# the balanced splits (this tree) against the attention kernels before them (9ee5702, .stash/old_attn), then this tree
# under the run's own tight bound
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/env.txt"; echo "commit $(cat .commit)" >> "$OUT/env.txt"
t0=$SECONDS
run() {  # $1 name, rest: extra flags
  name=$1; shift
  timeout 150 python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len 1024 --batch-sizes 1,8 \
    --configs "6,8,32;3,1,4" --skip-adaptive --decode-steps 24 --warmup-steps 2 "$@" \
    --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS-t0))s"; grep -E "bs=|^Speedup" "$OUT/$name.log"
}
run balanced_131072 --server-context-length 131072
cp -r .stash/old_attn/. .
run before_131072 --server-context-length 131072
git checkout -- specdec
run balanced_tight
