#!/usr/bin/env bash
# Whole decode steps, f0c105b's attention files (.stash/base, carried) against the tree, one after the other:
# ctx 4096 at bs 1/8/16/64 (the draft step's shared prefix matters most there), then ctx 1024 at bs 1/64.
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export AB_STEPS=32 AB_TIMEOUT=200
AB_CTX=4096 AB_BS="1,8,16,64" AB_CONFIGS="6,8,64;5,4,8;3,1,4" OUT="$OUT/ctx4096" bash scripts/gpu_ab.sh base=.stash/base new=.
AB_CTX=1024 AB_BS="1,16,64" AB_CONFIGS="6,8,64;5,4,8;3,1,4" OUT="$OUT/ctx1024" bash scripts/gpu_ab.sh base=.stash/base new=.
