#!/usr/bin/env bash
# What a new user gets tomorrow: README.md's two set-up commands in a new virtual environment, with the
# newest releases that pyproject.toml's bounds allow (constraints.txt dropped), then again as written
# (with constraints.txt). Prints the versions resolved and which command broke; exits non-zero if any did.
#   scripts/fresh_install_check.sh            both commands, unconstrained then constrained
#   MAIN_JOB=0 scripts/fresh_install_check.sh  the test command only (the main job takes minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
readme_cmd() {  # the n-th ```bash block of README.md's "Set up" section (1: main job, 2: tests)
  awk '/^## Set up/{s=1} /^## Use/{s=0} s && /^```bash/{n++; getline; if (n=='"$1"') print}' README.md
}
run_in_venv() {  # $1: label, $2: command
  local venv; venv=$(mktemp -d)/venv
  python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q --upgrade pip
  echo "== $1: $2"
  (source "$venv/bin/activate" && cd "$(mktemp -d)" && cp -r "$OLDPWD"/. . && bash -c "$2") > "$LOG/$1.log" 2>&1
  local rc=$?
  "$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|triton|numpy|tokenizers|gguf|safetensors|fastapi|pydantic|transformers) ' \
    | tr -s ' ' | paste -sd ';' | sed "s/^/   versions: /"
  if [ $rc -eq 0 ]; then echo "   ok"; else echo "   BROKE (exit $rc), last lines of $LOG/$1.log:"; tail -15 "$LOG/$1.log" | sed 's/^/   | /'; fi
  return $rc
}
LOG=$(mktemp -d); status=0
for which in unconstrained constrained; do
  for n in 2 1; do
    [ "$n" = 1 ] && [ "${MAIN_JOB:-1}" = 0 ] && continue
    cmd=$(readme_cmd "$n")
    [ "$which" = unconstrained ] && cmd=${cmd//-c constraints.txt /}
    run_in_venv "$which-$([ "$n" = 1 ] && echo main-job || echo tests)" "$cmd" || status=1
  done
done
echo "logs: $LOG"
exit $status
