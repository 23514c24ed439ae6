#!/usr/bin/env bash
# For the next session: why the small-tile plan for small tree grids (4a43fa2, reverted in d3bbe36)
# was faster alone (mb_tree_grid.json) and slower inside the 8B step (ab_*.json). One device call
# profiles 6x8x32 at bs 1 and 2, ctx 4096, with main's plan and with 4a43fa2's, kernels by GPU time
# (compare the tree verify's _extend_kernel and _merge_kernel rows, and the draft's kernels).
# Run from the repository root: bash <this file>; carry .stash/small-tiles (made below, here, first):
#   mkdir -p .stash/small-tiles/specdec/attention/triton_kernels
#   for f in common.py extend.py; do
#     git show 4a43fa2:specdec/attention/triton_kernels/$f > .stash/small-tiles/specdec/attention/triton_kernels/$f; done
OUT=${OUT:-$PWD/out}
AB_CONFIGS="6,8,32" AB_BS="1,2" AB_CTX=4096 AB_STEPS=16 AB_TIMEOUT=150 \
  AB_ARGS="--speculative-draft-model-quantization fp8" \
  AB_ARGS_main="--profile-device $OUT/prof_main.txt" AB_ARGS_small="--profile-device $OUT/prof_small.txt" \
  bash scripts/gpu_ab.sh main=. small=.stash/small-tiles
