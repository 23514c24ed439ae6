#!/usr/bin/env bash
set -uo pipefail
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT/r"
R="$OUT/r"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$R/env.txt"; echo "commit $(cat .commit) + tree" >> "$R/env.txt"
timeout 200 python3 -m pytest -m gpu -x -p no:cacheprovider tests/attention/test_triton_backend.py > "$R/gpu_attn_tests.log" 2>&1
echo "attn tests rc=$?"; tail -n 2 "$R/gpu_attn_tests.log"
AB_BS=1,2,4,8,16 AB_TIMEOUT=150 AB_STEPS=24 OUT="$R/c1k" bash scripts/gpu_ab.sh main=.stash/main_attn attn=.
AB_BS=1,4 AB_CTX=4096 AB_TIMEOUT=120 AB_STEPS=24 OUT="$R/c4k" bash scripts/gpu_ab.sh main=.stash/main_attn attn=.
# the FP8 GEMM tilings, with the draft-fp8 branch's kernel files
mkdir -p /tmp/fp8src && cp -r .stash/fp8src/. /tmp/fp8src/ && cp -r specdec /tmp/fp8src/ 2>/dev/null; cp -r .stash/fp8src/specdec/. /tmp/fp8src/specdec/
(cd /tmp/fp8src && PYTHONPATH=/tmp/fp8src timeout 200 python3 "$OLDPWD/.stash/mb/mb_gemv.py" "$R/mb_gemv.json" > "$R/mb_gemv.log" 2>&1; echo "gemv rc=$?")
grep -v Warn "$R/mb_gemv.log" | tail -40
tar -C "$OUT" -czf "$OUT/call6.tgz" r && rm -rf "$R"
