# GPU tests of the new dispatch, then A/B main vs the Triton kernel up to 64 tokens (device only)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/ab2; mkdir -p $R
timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider -o faulthandler_timeout=200 tests/models/test_gemv.py \
  tests/e2e/test_gpu_lossless.py tests/e2e/test_adaptive.py 2>&1 | tail -6 > $R/gpu_tests.log; cat $R/gpu_tests.log
run() {
  timeout 150 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,32;3,1,4" --batch-sizes 1,2,8,16,32,64 \
    --skip-adaptive --context-len 1024 --decode-steps 32 --warmup-steps 2 --output $R/$1.json > $R/$1.log 2>&1
  grep -E "bs=|Speedup" $R/$1.log | sed "s/^/$1 /"
}
run main
cp specdec/models/ops/gemv.py $R/gemv.py.main; cp specdec/models/ops/gemv_kernels.py $R/gemv_kernels.py.main
cp .stash/var_triton64/gemv.py .stash/var_triton64/gemv_kernels.py specdec/models/ops/
run triton64
cp $R/gemv.py.main specdec/models/ops/gemv.py; cp $R/gemv_kernels.py.main specdec/models/ops/gemv_kernels.py
