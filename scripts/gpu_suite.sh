#!/usr/bin/env bash
# The whole GPU run in one call: environment report, benchmarks, GPU tests; results under $OUT.
# Usage on the device machine (repo root): bash scripts/gpu_suite.sh [bench|synthetic|tests|graphs|all]
#   bench      kernel and attention benchmarks, the main job on the GPU
#   smoke      every benchmark script once on small cases (they share specdec.bench.device_timing's timers),
#              with the GPU tests of those timers: a check after changing them, not a measurement
#   synthetic  the Llama-3.1-8B-shaped sweep with simulated acceptance (CUDA graphs on), and its plot
#   tests      every GPU test (GPU_TESTS="paths...": only those; stopped after GPU_TESTS_TIMEOUT s, 500);
#              graphs  only the CUDA-graph and lossless GPU tests
#   adaptive   adaptive speculation: its and the replayed acceptance's GPU tests (the replay's kernels
#              too), then the 8B sweep (plain, each fixed shape, adaptive)
#              at ctx 1024 (bs 1-128) and 4096 (bs 1-64: bs 128 x 4k tokens of KV does not fit in 80 GB),
#              combined by benchmarks/adaptive_sweep.py into sweep.json / sweep.png / sweep.md; 360 timed
#              tokens a request (DECODE_STEPS: plain decoding's steps; a shape runs the 90-170 steps that
#              commit as many): with 24 steps, bs 8 drew 192 request-steps and run-to-run noise (~3 %)
#              was as large as the goal's margin; with 240 tokens, one host stall in a 59-step point
#              failed a cell (benchmarks/results/2026-11-27-h100-adaptive/)
#              (ADAPTIVE_CTX="1024 4096" picks the contexts; ADAPTIVE_TESTS=0 skips the tests)
#   prefix     the prefix cache on the 8B synthetic target: MT-bench-like multi-turn conversations, cache off
#              and on (prefill tokens saved, TTFT, throughput, KV bytes per token); its GPU tests run in
#              scripts/gpu_backends.sh (PYTEST_ARGS=tests/e2e/test_gpu_prefix_cache.py), which has FlashInfer
#   tp         tensor parallelism on every GPU of the host (two or four), in parts (TP_PARTS, default
#              "tests allreduce sweep"; each part fits one call):
#              tests      tests/e2e/test_gpu_tensor_parallel.py, test_gpu_custom_all_reduce.py (and
#                         test_gpu_device_index.py) at tp 2 and, on
#                         four GPUs, tp 4 (~6 min on four); TP_TESTS_K: pytest's -k ("tp4 or ranks4": tp 4
#                         alone); SIDE_TESTS="paths..." runs single-GPU tests at the same
#                         time on the last GPU (correctness only: nothing timed shares the call)
#              allreduce  benchmarks/bench_allreduce.py (NCCL vs one-shot latency by size) at 2 and 4 ranks
#              gemm       benchmarks/bench_decode_kernels.py's GEMMs on one rank's shards at each tp > 1 of TP_SIZES,
#                         with candidate tilings (--sweep): at tp 2 a step's GEMVs ran at ~77 % of the copy
#                         bandwidth (2026-11-29-h200x2-scale's profile)
#              sweep      the 8B sweep at each of TP_SIZES (default 1, 2 and, on four GPUs, 4): plain, TP_CONFIGS
#                         and adaptive, bs TP_BS, ctx TP_CTX, DECODE_STEPS plain steps a point (96: with 16, 5-7
#                         speculative steps made a point's speedup mostly sampling noise, 2026-11-29-h200x2-relay),
#                         each with --profile-device for the collectives'
#                         share of a step (smallest and largest bs); TP_NCCL=1 adds every tp > 1 with
#                         --disable-custom-all-reduce (NCCL only). benchmarks/scale_report.py makes scale.json
# A/B of source variants (a branch's files against the tree) in whole decode steps: scripts/gpu_ab.sh.
# The commit being measured is read from .commit (carry it: `git rev-parse --short HEAD > .commit`).
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
what="${1:-all}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
# FlashInfer as scripts/gpu_backends.sh installs it (run that first to restore its prebuilt kernels:
# installing again here would replace them)
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-workspace FLASHINFER_CUDA_ARCH_LIST="9.0a" TVM_FFI_CACHE_DIR=/tmp/tvm-ffi
if [ ! -d /tmp/site/flashinfer ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
. scripts/triton_cache.sh
{
  date -u; echo "commit $SPECDEC_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
status=0
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/bench_kernels.py --output-dir "$OUT" 2>&1 | tail -5
  python3 benchmarks/bench_attention.py --output-dir "$OUT" 2>&1 | tail -5
  # the main job end to end on the GPU (stories260K is tiny: this shows correctness and overheads)
  python3 -m specdec.cli bench --device cuda --attention-backend triton --output "$OUT/bench_throughput_gpu.json" 2>&1 | tail -16
fi
if [ "$what" = smoke ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_device_timing.py 2>&1 | tail -3 | tee "$OUT/gpu_tests.log"
  status=${PIPESTATUS[0]}
  run() { local name=$1; shift; "$@" > "$OUT/smoke_$name.log" 2>&1 || { status=1; echo "smoke: $name failed"; }; tail -2 "$OUT/smoke_$name.log"; }
  run kernels python3 benchmarks/bench_kernels.py --output-dir "$OUT/kernels" --reps 5
  run attention python3 benchmarks/bench_attention.py --output-dir "$OUT/attention" --backends triton \
    --batch-sizes 1 64 --contexts 1024 --tree-sizes 4 --iters 5
  run attention_splits python3 benchmarks/bench_attention_splits.py --output-dir "$OUT/splits" --iters 5
  run draft_gemm python3 benchmarks/bench_draft_gemm.py --output-dir "$OUT/draft_gemm" --tokens 17,64
  run decode_kernels python3 benchmarks/bench_decode_kernels.py --parts bandwidth,gemm --shapes qkv --tokens 1,32 \
    --output-dir "$OUT/decode"
  run synthetic python3 -m specdec.cli bench --synthetic llama-3.1-8b --batch-sizes 1,64 --configs "3,1,4;6,8,32" \
    --skip-adaptive --decode-steps 8 --warmup-steps 2 --context-len 512 --output "$OUT/synthetic_smoke.json"
fi
if [ "$what" = synthetic ] || [ "$what" = all ]; then
  python3 -m specdec.cli bench --synthetic llama-3.1-8b ${SYNTHETIC_ARGS:-} \
    --output "$OUT/bench_synthetic_8b.json" --plot "$OUT/speedup_8b.png" 2>&1 | tee "$OUT/bench_synthetic_8b.log"
fi
if [ "$what" = adaptive ]; then
  if [ "${ADAPTIVE_TESTS:-1}" != 0 ]; then
    python3 -m pytest -m gpu -x -p no:cacheprovider tests/e2e/test_adaptive.py tests/eagle/test_replay.py \
      tests/kernels/test_triton_ops.py -k "adaptive or replay or opcheck" 2>&1 | tee "$OUT/gpu_adaptive_tests.log" | tail -5
    status=${PIPESTATUS[0]}
  fi
  jsons=()
  for ctx in ${ADAPTIVE_CTX:-1024 4096}; do
    bs="1,2,4,8,16,32,64,128"; [ "$ctx" -gt 2048 ] && bs="1,2,4,8,16,32,64"
    python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len "$ctx" --batch-sizes "$bs" \
      --decode-steps "${DECODE_STEPS:-360}" --warmup-steps 2 ${SYNTHETIC_ARGS:-} \
      --output "$OUT/synthetic_ctx$ctx.json" 2>&1 | tee "$OUT/synthetic_ctx$ctx.log" | grep -E "^(plain|[0-9]|adaptive|Speedup)"
    [ -f "$OUT/synthetic_ctx$ctx.json" ] && jsons+=("$OUT/synthetic_ctx$ctx.json")
  done
  [ ${#jsons[@]} -gt 0 ] && python3 benchmarks/adaptive_sweep.py "${jsons[@]}" --output-dir "$OUT" --commit "$SPECDEC_COMMIT"
fi
if [ "$what" = prefix ]; then
  timeout "${PREFIX_TIMEOUT:-300}" python3 -m specdec.cli.bench multi-turn --synthetic llama-3.1-8b --device cuda \
    --attention-backend triton --config 5,4,8 --num-conversations 32 --turns 3 --first-turn-len 1024 --turn-len 128 \
    --max-new-tokens 128 --concurrency 8 --output "$OUT/multi_turn_8b.json" 2>&1 | tee "$OUT/multi_turn_8b.log"
  status=${PIPESTATUS[0]}
fi
if [ "$what" = tp ]; then
  gpus=$(nvidia-smi -L | wc -l)
  default_tp="1 2"; [ "$gpus" -ge 4 ] && default_tp="1 2 4"
  for part in ${TP_PARTS:-tests allreduce sweep}; do
    case $part in
      tests)
        side=""
        if [ -n "${SIDE_TESTS:-}" ]; then  # single-GPU tests beside, on the last GPU
          CUDA_VISIBLE_DEVICES=$((gpus - 1)) timeout "${SIDE_TESTS_TIMEOUT:-540}" python3 -m pytest -m gpu \
            -p no:cacheprovider -rs --durations=10 $SIDE_TESTS > "$OUT/gpu_side_tests.log" 2>&1 &
          side=$!
        fi
        timeout "${TP_TESTS_TIMEOUT:-480}" python3 -m pytest -m gpu -p no:cacheprovider -rs --durations=12 \
          -o faulthandler_timeout=200 ${TP_TESTS_K:+-k "$TP_TESTS_K"} tests/e2e/test_gpu_custom_all_reduce.py \
          tests/e2e/test_gpu_tensor_parallel.py tests/e2e/test_gpu_device_index.py \
          2>&1 | tee "$OUT/gpu_tp_tests.log" | tail -30
        status=${PIPESTATUS[0]}
        if [ -n "$side" ]; then
          wait "$side" || status=1
          echo "side tests:"; tail -25 "$OUT/gpu_side_tests.log"
        fi ;;
      gemm)  # one GPU: the skinny GEMMs on one rank's shards (the table's tiling, cuBLAS and candidates)
        for tp in ${TP_SIZES:-$default_tp}; do
          [ "$tp" -gt 1 ] || continue
          (cd benchmarks && timeout "${GEMM_TIMEOUT:-240}" python3 bench_decode_kernels.py --parts bandwidth,gemm \
            --tp "$tp" --sweep --tokens "${GEMM_TOKENS:-1,4,8}" --output-dir "$OUT/gemm_tp$tp") 2>&1 | tail -14
        done ;;
      allreduce)
        for n in 2 4; do
          [ "$n" -le "$gpus" ] || continue
          (cd benchmarks && timeout "${AR_BENCH_TIMEOUT:-90}" python3 bench_allreduce.py --world-size "$n" \
            --output "$OUT/allreduce_tp$n.json") 2>&1 | tee "$OUT/allreduce_tp$n.log" | tail -18
        done ;;
      sweep)
        runs=""
        for tp in ${TP_SIZES:-$default_tp}; do
          runs="$runs tp$tp"; [ "$tp" -gt 1 ] && [ "${TP_NCCL:-0}" = 1 ] && runs="$runs tp${tp}_nccl"
        done
        for run in $runs; do
          tp=${run#tp}; tp=${tp%_nccl}; extra=""; [ "$run" != "${run%_nccl}" ] && extra="--disable-custom-all-reduce"
          timeout "${TP_SWEEP_TIMEOUT:-300}" python3 -m specdec.cli bench --synthetic llama-3.1-8b --tp-size "$tp" $extra \
            --context-len "${TP_CTX:-1024}" --batch-sizes "${TP_BS:-1,2,4,8,16,32,64,128}" \
            --configs "${TP_CONFIGS:-3,1,4;5,4,8}" --decode-steps "${DECODE_STEPS:-96}" --warmup-steps 2 \
            --profile-device "$OUT/device_profile_$run.txt" ${SYNTHETIC_ARGS:-} --output "$OUT/synthetic_$run.json" \
            2>&1 | tee "$OUT/synthetic_$run.log" | grep -E "^(plain|[0-9]|adaptive|Speedup|  bs)"
        done ;;
      *) echo "TP_PARTS: tests, gemm, allreduce or sweep, not $part"; status=2 ;;
    esac
  done
fi
if [ "$what" = graphs ]; then
  python3 -m pytest -m gpu -x -p no:cacheprovider tests/e2e/test_gpu_cuda_graphs.py tests/e2e/test_gpu_lossless.py \
    2>&1 | tee "$OUT/gpu_graph_tests.log" | tail -30
  status=${PIPESTATUS[0]}
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # the server tests are CPU-only and need fastapi/uvicorn, which the device lacks; the FlashInfer /
  # FA3 tests run in scripts/gpu_backends.sh, which restores FlashInfer's prebuilt kernels first
  # interrupted (SIGINT: pytest still reports what ran) before the call's limit, so the Triton cache comes back
  timeout -s INT "${GPU_TESTS_TIMEOUT:-500}" python3 -m pytest -m gpu -p no:cacheprovider --ignore=tests/server --ignore=tests/test_bench_serving.py \
    --ignore=tests/attention/test_flashinfer_backend.py --ignore=tests/attention/test_flashattention_backend.py \
    --ignore=tests/e2e/test_gpu_backends.py --durations=15 --junitxml="$OUT/gpu_tests.xml" ${GPU_TESTS:-} 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -40
  status=${PIPESTATUS[0]}
fi
return_triton_cache
exit "$status"
