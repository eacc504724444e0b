#!/usr/bin/env bash
# numarun's end-to-end check on a GPU host, run once (about 7 minutes on one H200):
#   here:          bash scripts/fetch-gpu-wheels.sh        (wheels into .whl/, not committed)
#   on the host:   bash scripts/gpu-check.sh [gpu_check.py options]
#   rehearsal:     bash scripts/gpu-check.sh --self-test   (any machine: same set-up, no CUDA)
# The host has torch, nvidia-ml-py and nvidia-smi but no hydra-core and no package registry:
# the wheels in .whl/ (or $NUMARUN_WHEELS) that the host lacks are installed into a private
# target directory beside a 'numarun' link to this tree's launcher/ (the package's source
# folder), so numarun runs from this working tree. Results go to $OUT/gpu-check.{json,md}
# when OUT is set. Exit status: 0 when every check passed, 1 when one failed, 3 when the
# host is not usable.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY="${PYTHON:-python3}"
SITE="${NUMARUN_GPU_SITE:-/tmp/numarun-gpu-site}"
WHEELS="${NUMARUN_WHEELS:-.whl}"
SELF_TEST=0
for arg in "$@"; do [ "$arg" = --self-test ] && SELF_TEST=1; done

die() { echo "gpu-check: $*" >&2; exit 3; }

[ "$SELF_TEST" = 1 ] || command -v nvidia-smi >/dev/null || die "no nvidia-smi on PATH: not a GPU host"
"$PY" -c "import torch" 2>/dev/null || die "$PY cannot import torch"
"$PY" -c "import pynvml" 2>/dev/null || echo "gpu-check: warning: no pynvml (nvidia-ml-py): topology will not come from NVML" >&2

# wheel file prefix -> module it provides; a module the host already has is left alone, so the
# host's own numpy/PyYAML (built for its torch) win.
declare -A MODULE=(
  [hydra_core]=hydra [omegaconf]=omegaconf [antlr4_python3_runtime]=antlr4 [rich]=rich
  [markdown_it_py]=markdown_it [mdurl]=mdurl [pygments]=pygments [pyyaml]=yaml [numpy]=numpy
  [psutil]=psutil [packaging]=packaging
)
missing=()
for prefix in "${!MODULE[@]}"; do
  "$PY" -c "import ${MODULE[$prefix]}" 2>/dev/null && continue
  whl=$(ls "$WHEELS"/"${prefix}"-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || die "module ${MODULE[$prefix]} is missing and $WHEELS/ has no ${prefix} wheel (run scripts/fetch-gpu-wheels.sh where a registry is reachable)"
  missing+=("$whl")
done
# py-spy (the [debug] extra) is a program, not a module: taken when the host has none and .whl/ holds it.
if ! command -v py-spy >/dev/null; then
  spy=$(ls "$WHEELS"/py_spy-*.whl 2>/dev/null | head -1)
  [ -n "$spy" ] && missing+=("$spy")
fi
mkdir -p "$SITE"
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-check: installing ${missing[*]##*/} into $SITE"
  if ! "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "${missing[@]}"; then
    # No pip: a wheel is a zip whose top level is what site-packages holds.
    echo "gpu-check: pip failed; unpacking the wheels into $SITE" >&2
    "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$SITE" "${missing[@]}" \
      || die "cannot unpack the wheels into $SITE"
  fi
fi
# 'import numarun' = this tree's launcher/ (first on the path, before any installed numarun).
ln -sfn "$REPO/launcher" "$SITE/numarun" || die "cannot link $SITE/numarun to $REPO/launcher"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# 'numarun' on PATH for anything that calls it by name; the checks themselves use 'python -m numarun'.
mkdir -p "$SITE/bin"
printf '#!/bin/sh\nexec %s -m numarun "$@"\n' "$(command -v "$PY")" > "$SITE/bin/numarun"
chmod +x "$SITE/bin/numarun"
export PATH="$SITE/bin:$PATH"
unset NUMARUN_TOPOLOGY

"$PY" -c "
import os, sys, numarun.cli, hydra, omegaconf, rich, numpy
want = os.path.realpath(sys.argv[1])
got = os.path.dirname(os.path.realpath(numarun.__file__))
sys.exit(0 if got == want else f'numarun is imported from {got}, expected {want}')
" "$REPO/launcher" || die "numarun does not import from this tree with PYTHONPATH=$PYTHONPATH"
numarun --help >/dev/null || die "numarun --help failed"

# Ends even if a step hangs; results are written after every step anyway.
# About 4 minutes on one H200; the limit keeps one run under 6.5 minutes, so a second fits in
# a 15-minute allotment with the machine's start-up.
LIMIT="${GPU_CHECK_TIMEOUT:-390}"
timeout "$LIMIT" "$PY" scripts/gpu_check.py ${OUT:+--out "$OUT"} "$@"
rc=$?
[ "$rc" -eq 124 ] && echo "gpu-check: stopped after $LIMIT s; partial results in ${OUT:-(no OUT)}" >&2
exit "$rc"
