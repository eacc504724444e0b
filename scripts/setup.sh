#!/usr/bin/env bash
# Installs numarun and its test dependencies into ./.venv (idempotent).
#
# torch first, so that the package's 'torch>=2.4' does not pick the build: on Linux x86_64,
# plain PyPI's torch is the CUDA build (several GB of nvidia-* wheels). On a machine without an
# NVIDIA driver, torch==2.13.0 is asked for from the CPU index named by NUMARUN_TORCH_INDEX
# (default the PyTorch CPU index; empty skips it). Where that index cannot be reached, pip gives
# up after one short try and plain 'pip install torch==2.13.0' runs instead: the CPU build only
# where pip's own configuration offers one (a local wheel or mirror), otherwise the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${NUMARUN_TORCH:-torch==2.13.0}
TORCH_INDEX=${NUMARUN_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; then
    "${PIP[@]}" torch
  elif [ -n "$TORCH_INDEX" ] && "${PIP[@]}" --index-url "$TORCH_INDEX" --timeout 5 --retries 0 "$TORCH"; then
    :
  else
    echo "setup.sh: ${TORCH_INDEX:-no CPU index} did not serve $TORCH; installing it from pip's configured index" >&2
    "${PIP[@]}" "$TORCH"
  fi
  .venv/bin/python -W ignore -c 'import torch; print("setup.sh: torch", torch.__version__, "(CUDA build)" if torch.version.cuda else "(CPU build)")'
fi
"${PIP[@]}" -e '.[test]'
.venv/bin/numarun --version
