"""The environment contract between the launcher, the worker bootstrap, the trainer and
the sbatch script: every ``NUMARUN_*`` variable one side sets and another reads.

Pure constants (no imports), so every side, the sbatch template's renderer included,
names a variable from here instead of spelling it again.
"""

from __future__ import annotations

PLAN = "NUMARUN_PLAN"
"""Path of the LaunchPlan JSON every worker reads (set by the launcher)."""
STRICT_BINDING = "NUMARUN_STRICT_BINDING"
"""``1``: a binding failure is fatal for the worker (``--strict-binding``)."""
USER_ENV = "NUMARUN_USER_ENV"
"""Comma-separated plan variables whose value the user set; the bootstrap keeps those.
Unset (bootstrap started by hand): plan variables already in the environment are kept."""
LOG_LEVEL = "NUMARUN_LOG_LEVEL"
"""Level of the bootstrap's own log lines (default INFO)."""
FULL_EXIT = "NUMARUN_FULL_EXIT"
"""``1``: workers leave through the interpreter's full teardown instead of ``os._exit``."""
CONFIG = "NUMARUN_CONFIG"
"""Path of the composed job config (``config.yaml``) the trainer's ranks read."""
CONFIG_DIR = "NUMARUN_CONFIG_DIR"
"""A config directory to compose from instead of the packaged one."""
RUN_DIR = "NUMARUN_RUN_DIR"
"""The job's run directory, shared by every rank (and every node of a Slurm job)."""
HYDRA_NOW = "NUMARUN_HYDRA_NOW"
"""ISO time behind Hydra's ``${now:}`` in every rank of a user's Hydra app (set once by the
launcher unless already set, e.g. once for every node by a job script): one run dir for all ranks."""
TOPOLOGY = "NUMARUN_TOPOLOGY"
"""A topology source (recorded tree, tarball, JSON, hwloc XML, nvidia-smi text) instead of the live machine."""

ALL = (PLAN, STRICT_BINDING, USER_ENV, LOG_LEVEL, FULL_EXIT, CONFIG, CONFIG_DIR, RUN_DIR, HYDRA_NOW, TOPOLOGY)
