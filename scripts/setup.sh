#!/usr/bin/env bash
# Installs numarun and its test dependencies into ./.venv (idempotent).
# On a machine without an NVIDIA driver, torch==2.13.0 (CPU wheel) is installed first,
# so that the package's 'torch>=2.4' requirement does not pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/pip install -q torch
  else
    .venv/bin/pip install -q torch==2.13.0
  fi
fi
.venv/bin/pip install -q -e '.[test]'
.venv/bin/numarun --version
