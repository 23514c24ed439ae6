#!/usr/bin/env bash
# FlashAttention-4 (--attention-backend fa4) on the device machine: install the carried wheels, probe
# the API, run the fa4 tests, the attention benchmark and the 8B synthetic sweep. Results under $OUT.
#
# Usage (repo root on the device):  bash scripts/gpu_fa4.sh STEP...
#   part K     copy wheel part $FA4_PARTS/pK to /tmp/fa4 (one device call per part, back to back:
#              a call carries the tree plus one part under 64 MiB; /tmp lives while the machine is warm)
#   install    join the cutlass-dsl cu13 wheel, install every wheel into /tmp/site (skipped if done)
#   probe      scripts/fa4_probe.py: signature, LSE of empty rows, graph capture, mask_mod, split sweep
#   tests      the fa4 unit tests (real kernel vs torch_native, graph replay) and the e2e lossless tests,
#              fa4:triton (--prefill-attention-backend fa4) included; the log ends with pytest's exit code
#   bench      benchmarks/bench_fa4.py (decode / verify / extend / prefill vs triton, and others installed)
#   synthetic  the Llama-3.1-8B-shaped sweep with --attention-backend fa4 (SYNTHETIC_ARGS adds flags)
#
# The parts come from ../shared/tools/fa4_wheels.sh (run where pip has network):
#   bash ../shared/tools/fa4_wheels.sh .fa4 20   ->  .fa4/p0 (small wheels) .fa4/p1..p5 (cu13 wheel, split)
# e.g. calls carrying .fa4/p1 .. .fa4/p4 run `bash scripts/gpu_fa4.sh part 1` .. `part 4`; the last
# carries .fa4/p0 and .fa4/p5 and runs `bash scripts/gpu_fa4.sh part 0 part 5 install probe tests`.
set -uo pipefail
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
PARTS="${FA4_PARTS:-.fa4}"
SITE=/tmp/site
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
export SPECDEC_COMMIT="${SPECDEC_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}"
export CUTE_DSL_CACHE_DIR=/tmp/cute-dsl-cache
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/gpu_fa4.log"; }
status=0
while [ $# -gt 0 ]; do
  step=$1; shift
  case "$step" in
    part)
      k=$1; shift
      mkdir -p /tmp/fa4 && cp "$PARTS/p$k"/* /tmp/fa4/ && log "part $k: $(du -sh /tmp/fa4 | cut -f1) in /tmp/fa4" ;;
    install)
      if [ -d "$SITE/flash_attn" ]; then log "already installed"; continue; fi
      (cd /tmp/fa4 && cat cu13.part.* > nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl \
        && rm cu13.part.* && python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" /tmp/fa4/*.whl) \
        2>&1 | tail -5 | tee -a "$OUT/gpu_fa4.log"
      test -d "$SITE/flash_attn" || { log "install failed"; exit 1; }
      {
        date -u; echo "commit $SPECDEC_COMMIT"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
        python3 -c "import importlib.metadata as m; print(*(f'{d} {m.version(d)}' for d in ('flash-attn-4', 'nvidia-cutlass-dsl', 'quack-kernels')))"
        python3 -c "from specdec.attention import available_backends as a; print('available backends:', a())"
      } 2>&1 | tee "$OUT/env.txt" ;;
    probe)
      timeout "${PROBE_TIMEOUT:-200}" python3 scripts/fa4_probe.py "$OUT/fa4_probe.json" 2>&1 | tail -40 ;;
    tests)
      SPECDEC_ATTN_ERR_LOG="$OUT/attn_err.jsonl" timeout "${TESTS_TIMEOUT:-400}" python3 -m pytest -p no:cacheprovider -rs \
        -m gpu -x --durations=10 tests/attention/test_fa4_backend.py tests/e2e/test_gpu_fa4.py ${PYTEST_ARGS:-} 2>&1 \
        | tee "$OUT/gpu_fa4_tests.log" | tail -40
      status=${PIPESTATUS[0]}
      # NOTE: the device logs of 2026-11-24 lost pytest's closing "N passed" line; the exit code says it
      echo "pytest rc=$status" | tee -a "$OUT/gpu_fa4_tests.log" ;;
    bench)
      timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_fa4.py --output-dir "$OUT" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench_fa4.log" | tail -50 ;;
    synthetic)
      timeout "${SYNTHETIC_TIMEOUT:-400}" python3 -m specdec.cli bench --synthetic llama-3.1-8b --attention-backend fa4 \
        ${SYNTHETIC_ARGS:-} --output "$OUT/bench_synthetic_8b_fa4.json" 2>&1 | tee "$OUT/bench_synthetic_8b_fa4.log" | tail -30 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit "$status"
