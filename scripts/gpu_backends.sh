#!/usr/bin/env bash
# FlashInfer / FlashAttention-3 backends on the device machine, in one call: install the carried
# wheels, restore or JIT-build FlashInfer's kernels, run the backends' tests and the attention
# benchmark. Results (and the built kernels, to carry next time) under $OUT.
#
# Usage (repo root on the device; carry .whl and .commit):  bash scripts/gpu_backends.sh [build|tests|bench|all]...
#
# .whl/ (git-ignored) holds, fetched on a machine with pip and network (cp312, manylinux x86_64):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
#     flashinfer-python==0.6.0 apache-tvm-ffi==0.1.15.post2
#   flashinfer_python-0.6.0-py3-none-any.whl      7.5 MB  (JIT: sources + headers, no prebuilt kernels)
#   apache_tvm_ffi-0.1.15.post2-cp312-...whl      3.3 MB  (FlashInfer's only import the image lacks)
#   flashinfer-aot.tar.xz.part-*                  optional: kernels an earlier run built (from $OUT)
# FlashInfer's other declared needs (nvidia-cutlass-dsl, nvidia-cudnn-frontend, ...) serve kernels
# we do not call and are not imported by `import flashinfer` 0.6.0; the rest are in the image.
# No FA3 build can travel (see benchmarks/results/2026-11-22-h100-backends/README.md): its tests skip.
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
steps="${*:-all}"
LOG="$OUT/gpu_backends.log"
export PYTHONUNBUFFERED=1
export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
SITE=/tmp/site
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-workspace FLASHINFER_CUDA_ARCH_LIST="9.0a" MAX_JOBS="${MAX_JOBS:-16}"
export TVM_FFI_CACHE_DIR=/tmp/tvm-ffi
has() { [[ " $steps " == *" $1 "* || " $steps " == *" all "* ]]; }
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

# ------------------------------------------------------------------ install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  2>&1 | tee -a "$LOG" || exit 1
export PYTHONPATH="$PWD:$SITE"
AOT="$SITE/flashinfer/data/aot"  # FlashInfer loads <name>/<name>.so found here instead of building it
mkdir -p "$AOT" "$TVM_FFI_CACHE_DIR"
if ls .whl/flashinfer-aot.tar.xz.part-* >/dev/null 2>&1; then
  cat .whl/flashinfer-aot.tar.xz.part-* | xz -d | tar -x -C /tmp && cp -r /tmp/aot/. "$AOT/" \
    && cp -r /tmp/tvm-ffi-addon/. "$TVM_FFI_CACHE_DIR/" 2>/dev/null
  log "restored prebuilt kernels: $(ls "$AOT" | tr '\n' ' ')"
fi
{
  date -u; echo "commit $SPECDEC_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -2; echo "nproc $(nproc)"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, \
'native dlpack exchange api:', hasattr(torch.Tensor, '__dlpack_c_exchange_api__'))"
  python3 -c "import flashinfer, tvm_ffi; print('flashinfer', flashinfer.__version__, 'tvm_ffi', tvm_ffi.__version__)"
  python3 -c "from specdec.attention import available_backends as a; print('available backends:', a())"
} 2>&1 | tee -a "$LOG"

# ------------------------------------------------------------------ build (skips modules restored above)
if has build; then
  timeout "${BUILD_TIMEOUT:-250}" python3 -c "
import time
from specdec.attention.flashinfer_backend import build_kernels
t = time.time()
names = build_kernels()
print(f'built or found {len(names)} FlashInfer modules in {time.time() - t:.0f} s:', *names, sep='\\n  ')" 2>&1 \
    | tail -40 | tee -a "$LOG"
  # NOTE: only the .so files travel (16 MiB a file): new ones go to $OUT as parts of an xz'd tar
  rm -rf /tmp/aot /tmp/tvm-ffi-addon && mkdir -p /tmp/aot /tmp/tvm-ffi-addon
  for so in "$FLASHINFER_WORKSPACE_BASE"/.cache/flashinfer/*/*/cached_ops/*/*.so; do
    [ -f "$so" ] || continue
    name=$(basename "$so" .so); mkdir -p "/tmp/aot/$name"; cp "$so" "/tmp/aot/$name/"
  done
  cp "$TVM_FFI_CACHE_DIR"/*.so /tmp/tvm-ffi-addon/ 2>/dev/null
  if [ -n "$(ls /tmp/aot)" ]; then
    (cd /tmp && tar -c aot tvm-ffi-addon | xz -T0 -3 | split -b 15m - "$OUT/flashinfer-aot.tar.xz.part-")
    log "new kernels: $(du -sh /tmp/aot | cut -f1) -> $(du -ch "$OUT"/flashinfer-aot.tar.xz.part-* | tail -1 | cut -f1) xz"
    du -b /tmp/aot/*/*.so | tee -a "$LOG"
  else
    log "no new kernels built"
  fi
fi

status=0
# ------------------------------------------------------------------ tests
if has tests; then
  SPECDEC_ATTN_ERR_LOG="$OUT/attn_err.jsonl" timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -p no:cacheprovider -rs \
    --durations=8 tests/attention/test_registry.py tests/attention/test_flashinfer_backend.py \
    tests/attention/test_flashattention_backend.py tests/e2e/test_gpu_backends.py ${PYTEST_ARGS:-} 2>&1 \
    | tail -60 | tee -a "$LOG"
  status=${PIPESTATUS[0]}
  [ -f "$OUT/attn_err.jsonl" ] && python3 -c "
import json, collections
rows = [json.loads(l) for l in open('$OUT/attn_err.jsonl')]
by = collections.defaultdict(list)
for r in rows: by[(r['backend'], r['case'].split('-')[-1])].append(r['ratio'])
for k, v in sorted(by.items()): print('max |ours - fp32| / |lowp - fp32|', k, f'{max(v):.2f} over {len(v)} cases')" \
    | tee -a "$LOG"
fi
# ------------------------------------------------------------------ benchmark
if has bench; then
  timeout "${BENCH_TIMEOUT:-240}" python3 benchmarks/bench_attention.py --output-dir "$OUT" 2>&1 | tail -40 | tee -a "$LOG"
fi
exit "$status"
