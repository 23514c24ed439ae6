#!/usr/bin/env bash
# verify attention: GPU tests of the verify-attn files, and kernel timelines main vs attn
set -uo pipefail
OUT="${OUT:-$PWD/out}"; R="$OUT/r"; mkdir -p "$R"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
for v in main_attn attn; do
  AB_BS=1,4 AB_TIMEOUT=120 AB_STEPS=4 AB_ARGS="--profile-device $R/kernels_$v.txt --profile-trace $R/trace_$v" OUT="$R/prof" \
    bash scripts/gpu_ab.sh $v=.stash/$v > /dev/null 2>&1; echo "$v rc=$?"
done
backup=$(mktemp -d); for f in $(cd .stash/attn && find . -type f); do mkdir -p "$backup/$(dirname $f)"; cp "$f" "$backup/$f"; done
cp -r .stash/attn/. .
timeout 300 python3 -m pytest -m gpu -x -p no:cacheprovider tests/attention/test_triton_backend.py --durations=5 > "$R/gpu_attn_tests.log" 2>&1
echo "attn tests rc=$?"; tail -n 12 "$R/gpu_attn_tests.log"
cp -r "$backup/." .
tar -C "$OUT" -czf "$OUT/call8.tgz" r && rm -rf "$R"
