# A/B of linear-layer dispatch variants on the 8B synthetic step (device only; results under /tmp/ab)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
R=/tmp/ab; mkdir -p $R; cp specdec/models/ops/gemv.py $R/gemv_main.py
run() {  # name configs batch_sizes
  timeout 200 python3 -m specdec.cli bench --synthetic llama-3.1-8b --configs "$2" --batch-sizes "$3" --skip-adaptive \
    --context-len 1024 --decode-steps 32 --warmup-steps 2 --output $R/$1.json > $R/$1.log 2>&1
  grep -E "bs=|Speedup" $R/$1.log | sed "s/^/$1 /"
}
for v in main triton32 lt; do
  case $v in main) cp $R/gemv_main.py specdec/models/ops/gemv.py;; *) cp .stash/var_$v/gemv.py specdec/models/ops/gemv.py;; esac
  run $v "6,8,32;3,1,4" "1,4,8,16,32,64"
done
cp $R/gemv_main.py specdec/models/ops/gemv.py
