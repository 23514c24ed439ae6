#!/usr/bin/env bash
# Issue #41 on one GPU: where decode and verify part in bf16, and how often speculation changes a
# greedy answer, default path against --enable-deterministic-inference. Writes under $OUT:
#   paths-bs1.json, paths-bs8.json   benchmarks/bf16_paths.py on CUDA / triton (default path): each sub-op's
#                                    max |diff| between a decode step and the same token inside a verify
#                                    (chain of 1, chain of 4, tree), propagated and isolated (GEMMs at M=1 vs M=bs*N)
#   paths-det-bs8.json               the same under --enable-deterministic-inference (expected: no stage differs)
#   exact.json                       benchmarks/bf16_exact.py: [{"mode", "workload", "concurrency", "identical",
#                                    "total", "first_difference", ...}] for SmolLM2 + our EAGLE-3 head, MT-bench,
#                                    greedy, 256 tokens, 8 prompts one at a time and 80 at once, default and
#                                    deterministic
#   *.log                            each step's output
# PATHS (default "paths-bs1 paths-bs8 paths-det-bs8") picks the diagnosis runs; EXACT_CONCURRENCY (default "1 80"),
# EXACT_MODES (default "default deterministic"), EXACT_DATASETS (default mt_bench; several run through the same
# two engines), EXACT_ARGS (more bf16_exact.py flags), EXACT_VARIANTS (default head: the tree as it is; else parts
# joined by +: splits1, every attention kernel in one split, no split plan that follows the batch; nodes8, node
# groups for verify trees of up to 8 nodes only (before 2026-12-01); noradix, the prefix cache off; each variant
# but head writes exact-VARIANT.json, + written -, all output goes to exact.log; its "==" lines show each
# overlay's changed lines),
# e.g. NGRAM's agreement with the first differing token's top-2 gap, prefix cache off:
#   PATHS= EXACT_MODES=default EXACT_CONCURRENCY="1 32" EXACT_DATASETS="summarization humaneval" \
#     EXACT_ARGS="--algorithm NGRAM --gaps --engine-arg disable_radix_cache=true" bash scripts/bf16_exact.sh
# Needs the SmolLM2 GGUF put and installed first (scripts/gpu_peer.sh put .peer/p-0N ...; install), as for
# gpu_peer.sh chat: it exports the GGUF once to /tmp/smollm2-bf16. About 3-5 minutes on an H200.
#   bash scripts/bf16_exact.sh
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site"
GGUF=/tmp/peer-parts/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL=/tmp/smollm2-bf16
[ -d $SMOL ] || python3 benchmarks/peer/export_gguf.py $GGUF $SMOL > "$OUT/export.log" 2>&1 \
  || { tail "$OUT/export.log"; exit 1; }
paths() {  # paths NAME ARGS...: one diagnosis run
  local name=$1; shift
  timeout 240 python3 benchmarks/bf16_paths.py --model $SMOL --device cuda --dtype bfloat16 --attention-backend triton \
    --context 300 --num-tokens 4 --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1 || echo "!! $name exited $?"
  grep -E "^\[|first differing" "$OUT/$name.log" | head -8
}
for name in ${PATHS-paths-bs1 paths-bs8 paths-det-bs8}; do  # PATHS="": no diagnosis
  case $name in
    paths-bs1) paths paths-bs1 --batch-size 1 ;;
    paths-bs8) paths paths-bs8 --batch-size 8 ;;
    paths-det-bs8) paths paths-det-bs8 --batch-size 8 --enable-deterministic-inference ;;
  esac
done
variant_args() {  # variant_args VARIANT DIR: DIR's specdec with VARIANT's changes, echoes its extra flags
  local file=$2/specdec/attention/triton_backend.py part
  for part in ${1//+/ }; do
    case $part in
      head) ;;
      splits1) edit "$file" '^        self.num_splits = num_splits$' 's/num_splits$/num_splits or 1/' || return 1 ;;
      nodes8) edit "$file" '^VERIFY_ROWS_MAX_NODES = 16$' 's/= 16$/= 8/' || return 1 ;;
      noradix) echo "--engine-arg disable_radix_cache=true" ;;
      *) echo "!! unknown variant part $part" >&2; return 1 ;;
    esac
  done
}
edit() {  # edit FILE LINE SED: SED on FILE's lines matching LINE, an error if none does (the tree moved on)
  grep -q "$2" "$1" || { echo "!! no line $2 in $1" >&2; return 1; }
  sed -i "/$2/$3" "$1"
}
for variant in ${EXACT_VARIANTS:-head}; do
  dir=$PWD name=exact
  if [ $variant != head ]; then
    dir=/tmp/variant-${variant//+/-} name=exact-${variant//+/-}  # NOTE: $OUT returns no names with +
    rm -rf $dir && mkdir -p $dir && cp -r specdec benchmarks $dir/
  fi
  extra=$(variant_args $variant $dir) || continue
  echo "== $variant: ${EXACT_DATASETS:-mt_bench}; $(diff specdec/attention/triton_backend.py \
    $dir/specdec/attention/triton_backend.py | grep '^>' | tr -s ' ') $extra" >> "$OUT/exact.log"
  (cd $dir && PYTHONPATH="$dir:/tmp/site" timeout ${EXACT_TIMEOUT:-420} python3 benchmarks/bf16_exact.py \
    --model $SMOL --device cuda --dtype bfloat16 --concurrency ${EXACT_CONCURRENCY:-1 80} --num-prompts 8 \
    --max-new-tokens 256 --dataset ${EXACT_DATASETS:-mt_bench} --modes ${EXACT_MODES:-default deterministic} \
    ${EXACT_ARGS:-} $extra --json "$OUT/$name.json") >> "$OUT/exact.log" 2>&1 \
    || echo "!! bf16_exact ($variant) exited $?"
done
grep -E "^== |identical" "$OUT/exact.log"
exit 0
