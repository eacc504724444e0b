#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels scripts/gpu-check.sh installs on a
# GPU host that has none: numarun's pure-Python dependencies that such a host (torch and
# nvidia-ml-py preinstalled) usually lacks. They land in .whl/ (ignored by git); copy .whl/ to
# the GPU host together with the working tree.
#
#   bash scripts/fetch-gpu-wheels.sh            # target: CPython 3.12 on x86_64 Linux
#   PYVER=3.11 bash scripts/fetch-gpu-wheels.sh # another Python on the GPU host
#   NUMARUN_WHEELS=DIR ...                      # into DIR instead of .whl/ (gpu-check.sh reads the same variable)
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
PIP="${PIP:-python3 -m pip}"
DEST="${NUMARUN_WHEELS:-.whl}"
mkdir -p "$DEST"

# Versions are the ones the test suite runs with (the project's .venv).
PURE=(hydra-core==1.3.8 omegaconf==2.3.1 packaging==26.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0)
BINARY=(PyYAML==6.0.4 numpy==2.4.6 psutil==7.2.2)
# The [debug] extra: the hang roll-call's native frames (a program in the wheel's scripts, no module).
TOOLS=(py-spy==0.4.3)

download() {
  $PIP download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "$DEST" "$1"
}
for spec in "${PURE[@]}" "${BINARY[@]}" "${TOOLS[@]}"; do
  echo "fetching $spec"
  download "$spec"
done

# hydra-core pins antlr4-python3-runtime==4.9.*, which PyPI has as an sdist only: build the
# (pure-Python) wheel here.
if ! ls "$DEST"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  echo "building antlr4-python3-runtime==4.9.3 (sdist only on PyPI)"
  $PIP wheel --quiet --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
fi

ls -l "$DEST"
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total $((total / 1024)) KiB in $DEST"
if [ "$total" -gt $((48 * 1024 * 1024)) ]; then
  echo "fetch-gpu-wheels: $DEST holds $((total / 1048576)) MiB; expected well under 48 MiB to copy along" >&2
  exit 1
fi
