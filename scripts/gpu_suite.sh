#!/usr/bin/env bash
# The whole GPU run in one call: environment report, GPU tests, benchmarks; results under $OUT.
# Usage on the device machine (repo root): bash scripts/gpu_suite.sh [tests|bench|all]
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
what="${1:-all}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
  date -u; git rev-parse --short HEAD 2>/dev/null || true
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
  for b in benchmarks/bench_kernels.py benchmarks/bench_attention.py; do
    [ -f "$b" ] && python3 "$b" --output-dir "$OUT" 2>&1 | tail -40
  done
fi
exit "$status"
