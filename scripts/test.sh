#!/usr/bin/env bash
# The project's test command: installs (scripts/setup.sh), then runs the whole suite, which
# includes building the sdist and wheel and running the installed wheel from a foreign
# directory (tests/e2e/test_wheel.py, in the venv .venv-wheel/, kept between runs).
# As root on Linux it also brings up the four-node Slurm test cluster for the cluster tests
# (scripts/test-cluster.sh) and always tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
# The cluster's daemons, runuser, ip and tc live in sbin, which a minimal PATH can leave out.
export PATH="$PATH:/usr/sbin:/sbin"
# System packages, as root where apt-get is: Slurm and munge for the test cluster
# (scripts/test-cluster.sh install), Debian's MPI launchers (openmpi-bin, mpich) for the tests
# that start ranks with mpirun/mpiexec, and the OCI runtime crun for the container tests
# (tests/support/containers.py). They install while setup.sh installs the Python ones.
# NUMARUN_TEST_MPI and NUMARUN_TEST_CRUN are exported even when the install fails: those tests
# then fail naming what is missing instead of being skipped.
cluster_wanted() { [ -x scripts/test-cluster.sh ] && [ "$(id -u)" = 0 ] && [ "${NUMARUN_NO_CLUSTER:-}" != 1 ]; }
mpi_wanted() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ "${NUMARUN_NO_MPI:-}" != 1 ]; }
install_mpi() {
  command -v mpirun.openmpi >/dev/null && command -v mpiexec.mpich >/dev/null && command -v crun >/dev/null && return 0
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin mpich crun)
  { "${apt[@]}" || { apt-get update -qq && "${apt[@]}"; }; } >/tmp/numarun-apt-mpi.log 2>&1 \
    || echo "could not install openmpi-bin, mpich and crun (see /tmp/numarun-apt-mpi.log): MPI and container tests will fail" >&2
}
packages=
if command -v apt-get >/dev/null && { cluster_wanted || mpi_wanted; }; then
  { if cluster_wanted; then bash scripts/test-cluster.sh install || true; fi
    if mpi_wanted; then install_mpi; fi; } &
  packages=$!
fi
bash scripts/setup.sh
[ -z "$packages" ] || wait "$packages" || true
if mpi_wanted; then export NUMARUN_TEST_MPI=1 NUMARUN_TEST_CRUN=1; fi
status=0
if cluster_wanted; then
  trap 'bash scripts/test-cluster.sh down || true' EXIT
  # Exported even when 'up' fails: the cluster tests then fail (naming the missing env
  # file) instead of being skipped, so a broken cluster never passes as green.
  export NUMARUN_TEST_CLUSTER=/tmp/numarun-cluster/env
  rm -f "$NUMARUN_TEST_CLUSTER"
  bash scripts/test-cluster.sh up --nodes 4 || echo "test cluster did not come up: cluster tests will fail" >&2
fi
# Layout (ruff format: the formatter owns it), lint (the package, its tests and scripts), type check and the
# layers contract of the package (settings in pyproject.toml; ruff, mypy and import-linter come with the [test]
# extras that setup.sh installs); NUMARUN_LINT=0 skips them. They run beside the tests (the type check of a fresh
# clone takes about 20 s of one core) and say what they found after them; a finding fails the test command.
lint=
lint_log=$(mktemp)
if [ "${NUMARUN_LINT:-1}" != 0 ]; then
  { found=0
    .venv/bin/ruff format --check launcher hydra_plugins tests scripts || found=1
    .venv/bin/ruff check launcher hydra_plugins tests scripts || found=1
    .venv/bin/mypy launcher || found=1
    .venv/bin/lint-imports || found=1
    exit $found; } >"$lint_log" 2>&1 &
  lint=$!
fi
# Three pytest-xdist workers (NUMARUN_TEST_WORKERS; tests/conftest.py keeps a file, the Slurm cluster and the
# network namespaces each on one worker): on 2 cores the tests wait on processes as much as they compute.
.venv/bin/python -m pytest -n "${NUMARUN_TEST_WORKERS:-3}" "$@" || status=$?
if [ -n "$lint" ]; then
  wait "$lint" || status=$(( status ? status : 1 ))
  cat "$lint_log"
fi
rm -f "$lint_log"
exit $status
