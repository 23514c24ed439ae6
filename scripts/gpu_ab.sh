#!/usr/bin/env bash
# A/B of source variants in whole decode steps, in one device call: the synthetic 8B sweep once per
# variant, one after another on the same GPU, so every ratio has a same-call baseline.
#
# Usage (repo root; carry the variant folders):
#   bash scripts/gpu_ab.sh NAME=DIR [NAME=DIR ...]
# DIR holds files at their repository paths (DIR/specdec/models/ops/gemv.py, ...), copied over the
# tree for that variant's run and restored after it; DIR "." is the tree as it is. Make one from a
# branch, here, before the call (".stash/" is git-ignored):
#   git diff --name-only main BRANCH | while read -r f; do
#     mkdir -p ".stash/BRANCH/$(dirname "$f")"; git show "BRANCH:$f" > ".stash/BRANCH/$f"; done
# Settings: AB_CONFIGS ("6,8,32;3,1,4"), AB_ADAPTIVE (non-empty: adaptive speculation too),
# AB_BS ("1,2,8,16,32,64"), AB_CTX (1024), AB_STEPS (32), AB_SHAPE (llama-3.1-8b; "tiny" with
# AB_ARGS="--device cpu --attention-backend torch_native" checks the script on a CPU), AB_TIMEOUT (s a
# variant, 200),
# AB_ARGS (more `specdec bench --synthetic` flags), AB_ARGS_NAME (flags for variant NAME only, e.g.
# AB_ARGS_fp8="--speculative-draft-model-quantization fp8" with fp8=.). Writes $OUT/ab_NAME.json /
# .log; prints each point's step time and phases.
# AB_RUN: any other command instead of the sweep, run per variant through bash with AB_OUT set to
# $OUT/ab_NAME/ (its log in $OUT/ab_NAME.log), e.g. the target's prefill per layer:
#   AB_RUN='python3 benchmarks/bench_attention.py --backends triton --tree-sizes 0 --prefill 1 16 256
#           --output-dir $AB_OUT' bash scripts/gpu_ab.sh main=. prefill=.stash/prefill
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
backup="$(mktemp -d)"
restore() {  # the replaced files back, the added ones gone
  [ -d "$backup/tree" ] && cp -r "$backup/tree/." . && rm -rf "$backup/tree"
  [ -f "$backup/added" ] && xargs -r rm -f < "$backup/added" && rm -f "$backup/added"
  true
}
trap 'restore; rm -rf "$backup"' EXIT
status=0
for spec in "$@"; do
  name="${spec%%=*}" dir="${spec#*=}"
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "gpu_ab: variant name $name: letters, digits, _" >&2; exit 2; }
  if [ "$dir" != . ]; then
    [ -d "$dir" ] || { echo "gpu_ab: no folder $dir for variant $name" >&2; exit 2; }
    (cd "$dir" && find . -type f) | while read -r f; do  # save what the variant replaces or adds
      if [ -f "$f" ]; then mkdir -p "$backup/tree/$(dirname "$f")" && cp "$f" "$backup/tree/$f"
      else echo "$f" >> "$backup/added"; fi
    done
    cp -r "$dir/." .
    echo "$name: $(cd "$dir" && find . -type f | wc -l) file(s) over the tree"
  fi
  if [ -n "${AB_RUN:-}" ]; then
    mkdir -p "$OUT/ab_$name"
    AB_OUT="$OUT/ab_$name" timeout "${AB_TIMEOUT:-200}" bash -c "$AB_RUN" > "$OUT/ab_$name.log" 2>&1 || status=1
    tail -n "${AB_TAIL:-20}" "$OUT/ab_$name.log" | sed "s/^/$name  /"
  else
    own_args="AB_ARGS_$name"
    timeout "${AB_TIMEOUT:-200}" python3 -m specdec.cli bench --synthetic "${AB_SHAPE:-llama-3.1-8b}" \
      --configs "${AB_CONFIGS:-6,8,32;3,1,4}" --batch-sizes "${AB_BS:-1,2,8,16,32,64}" \
      $([ -n "${AB_ADAPTIVE:-}" ] || echo --skip-adaptive) \
      --context-len "${AB_CTX:-1024}" --decode-steps "${AB_STEPS:-32}" --warmup-steps 2 ${AB_ARGS:-} ${!own_args:-} \
      --output "$OUT/ab_$name.json" > "$OUT/ab_$name.log" 2>&1 || status=1
    grep -E "^[0-9a-z]+: engine|bs=|Speedup" "$OUT/ab_$name.log" | sed "s/^/$name  /"
  fi
  restore
done
exit "$status"
