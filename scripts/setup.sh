#!/usr/bin/env bash
# Installs numarun, its test dependencies and the docs site's tools into ./.venv (idempotent). 'setup.sh torch': the torch step only.
#
# torch first, so that the package's 'torch>=2.4' does not pick the build: on Linux x86_64,
# plain PyPI's torch is the CUDA build (several GB of nvidia-* wheels). On a machine without an
# NVIDIA driver, torch==2.13.0 is asked for from the CPU index named by NUMARUN_TORCH_INDEX
# (default the PyTorch CPU index; empty skips it), quietly. Where that index cannot serve it, pip
# gives up after one short try and plain 'pip install torch==2.13.0' runs instead. pip's output is
# shown only when that fails too; otherwise one line says which build came from where, and why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${NUMARUN_TORCH:-torch==2.13.0}
NAME=${TORCH%%[=<>!~ ]*}
TORCH_INDEX=${NUMARUN_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q)
if ! .venv/bin/python -c "import $NAME" 2>/dev/null; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  get() { .venv/bin/python -m pip install "$@" --report "$work/report.json" "$TORCH"; }
  if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; then
    TORCH=$NAME
    why="an NVIDIA driver is present"
    get -q
  elif [ -n "$TORCH_INDEX" ] && get -vv --index-url "$TORCH_INDEX" --timeout 5 --retries 0 >"$work/probe.log" 2>&1; then
    why="asked of the CPU index $TORCH_INDEX"
  else
    if [ -z "$TORCH_INDEX" ]; then
      why="NUMARUN_TORCH_INDEX is empty"
    elif grep -qE "Could not fetch URL .*(connection error|timed out|Failed to establish)" "$work/probe.log"; then
      why="$TORCH_INDEX was unreachable"
    else
      why="$TORCH_INDEX has no $TORCH for this machine"
    fi
    why="from pip's configured sources, as $why"
    if ! get -q >"$work/pip.log" 2>&1; then
      echo "setup.sh: $TORCH could not be installed; pip said:" >&2
      grep -hE "^(ERROR|WARNING)|Could not fetch URL" "$work/probe.log" "$work/pip.log" >&2 || true
      exit 1
    fi
  fi
  .venv/bin/python - "$work/report.json" "$NAME" "$why" <<'EOF'
import json, sys, urllib.parse
path, name, why = sys.argv[1:]
got = next(i for i in json.load(open(path))["install"] if i["metadata"]["name"].lower() == name.lower())
version, url = got["metadata"]["version"], urllib.parse.unquote(got["download_info"]["url"])
needs_cuda = any(r.startswith("nvidia-") for r in got["metadata"].get("requires_dist") or [])
build = "CPU build" if "+cpu" in version else "CUDA build" if needs_cuda else "build"
print(f"setup.sh: {name} {version} ({build}) from {url}: {why}")
EOF
fi
[ "${1:-}" = torch ] && exit 0
"${PIP[@]}" -e '.[test,docs]'  # docs: the site and its tested examples (mkdocs.yml)
.venv/bin/numarun --version
