#!/usr/bin/env bash
# After review: the W8A8 GEMM's GPU tests at HEAD, and --tune at 128 tokens (its promotion column
# now with 0 = no promotion).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
{ date -u; echo "commit $(cat .commit)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $OUT/env_check.txt
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -p no:warnings tests/models/test_w8a8_gemm.py > $OUT/gpu_tests_check.log 2>&1
echo "pytest rc=$?"; tail -2 $OUT/gpu_tests_check.log
timeout 200 python3 benchmarks/bench_draft_gemm.py --tune --tokens 128 --output-dir $OUT > $OUT/tune_check.log 2>&1
echo "tune rc=$?"; python3 -c "
import json; d=json.load(open('$OUT/w8a8_tune.json'))
for r in d['rows']: print(r['gemm'], r['tokens'], 'scaled_mm', r['scaled_mm'], 'best', r['best']['us'], r['best_row_err_by_promotion'])"
