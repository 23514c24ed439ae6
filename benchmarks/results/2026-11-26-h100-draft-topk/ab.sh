# GPU tests of the draft top-k, then A/B against the draft step before it (device only; results under /tmp/ab3)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/ab3; mkdir -p $R
timeout 230 python3 -m pytest -m gpu -p no:cacheprovider -o faulthandler_timeout=200 tests/models/test_topk.py \
  tests/e2e/test_gpu_lossless.py tests/e2e/test_adaptive.py > $R/gpu_tests.log 2>&1; tail -3 $R/gpu_tests.log
run() {
  timeout 120 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "6,8,32;5,4,8;3,1,4" --batch-sizes 1,2,4,8 \
    --skip-adaptive --context-len 1024 --decode-steps 32 --warmup-steps 2 --output $R/$1.json > $R/$1.log 2>&1
  grep -E "bs=|Speedup" $R/$1.log | sed "s/^/$1 /"
}
run topk
cp specdec/eagle/draft.py $R/draft_topk.py; cp .stash/draft_before.py specdec/eagle/draft.py
run before
cp $R/draft_topk.py specdec/eagle/draft.py
