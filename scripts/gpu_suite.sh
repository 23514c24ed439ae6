#!/usr/bin/env bash
# The whole GPU run in one call: environment report, benchmarks, GPU tests; results under $OUT.
# Usage on the device machine (repo root): bash scripts/gpu_suite.sh [bench|synthetic|tests|graphs|all]
#   bench      kernel and attention benchmarks, the main job on the GPU
#   synthetic  the Llama-3.1-8B-shaped sweep with simulated acceptance (CUDA graphs on), and its plot
#   tests      every GPU test;  graphs  only the CUDA-graph and lossless GPU tests
#   adaptive   adaptive speculation: its GPU tests, then the 8B sweep (plain, each fixed shape, adaptive)
#              at ctx 1024 (bs 1-128) and 4096 (bs 1-64: bs 128 x 4k tokens of KV does not fit in 80 GB),
#              combined by benchmarks/adaptive_sweep.py into sweep.json / sweep.png / sweep.md
#              (ADAPTIVE_CTX="1024 4096" picks the contexts; ADAPTIVE_TESTS=0 skips the tests)
# The commit being measured is read from .commit (carry it: `git rev-parse --short HEAD > .commit`).
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
what="${1:-all}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
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
if [ "$what" = synthetic ] || [ "$what" = all ]; then
  python3 -m specdec.cli bench --synthetic llama-3.1-8b ${SYNTHETIC_ARGS:-} \
    --output "$OUT/bench_synthetic_8b.json" --plot "$OUT/speedup_8b.png" 2>&1 | tee "$OUT/bench_synthetic_8b.log"
fi
if [ "$what" = adaptive ]; then
  if [ "${ADAPTIVE_TESTS:-1}" != 0 ]; then
    python3 -m pytest -m gpu -x -q -p no:cacheprovider tests/e2e/test_adaptive.py 2>&1 | tee "$OUT/gpu_adaptive_tests.log" | tail -5
    status=${PIPESTATUS[0]}
  fi
  jsons=()
  for ctx in ${ADAPTIVE_CTX:-1024 4096}; do
    bs="1,2,4,8,16,32,64,128"; [ "$ctx" -gt 2048 ] && bs="1,2,4,8,16,32,64"
    python3 -m specdec.cli bench --synthetic llama-3.1-8b --context-len "$ctx" --batch-sizes "$bs" \
      --decode-steps "${DECODE_STEPS:-16}" --warmup-steps 2 ${SYNTHETIC_ARGS:-} \
      --output "$OUT/synthetic_ctx$ctx.json" 2>&1 | tee "$OUT/synthetic_ctx$ctx.log" | grep -E "^(plain|[0-9]|adaptive|Speedup)"
    [ -f "$OUT/synthetic_ctx$ctx.json" ] && jsons+=("$OUT/synthetic_ctx$ctx.json")
  done
  [ ${#jsons[@]} -gt 0 ] && python3 benchmarks/adaptive_sweep.py "${jsons[@]}" --output-dir "$OUT" --commit "$SPECDEC_COMMIT"
fi
if [ "$what" = graphs ]; then
  python3 -m pytest -m gpu -x -q -p no:cacheprovider tests/e2e/test_gpu_cuda_graphs.py tests/e2e/test_gpu_lossless.py \
    2>&1 | tee "$OUT/gpu_graph_tests.log" | tail -30
  status=${PIPESTATUS[0]}
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # the server tests are CPU-only and need fastapi/uvicorn, which the device lacks; the FlashInfer /
  # FA3 tests run in scripts/gpu_backends.sh, which restores FlashInfer's prebuilt kernels first
  python3 -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/server --ignore=tests/test_bench_serving.py \
    --ignore=tests/attention/test_flashinfer_backend.py --ignore=tests/attention/test_flashattention_backend.py \
    --ignore=tests/e2e/test_gpu_backends.py --durations=15 --junitxml="$OUT/gpu_tests.xml" 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -40
  status=${PIPESTATUS[0]}
fi
exit "$status"
