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
REPORT = "NUMARUN_REPORT"
"""File that ``numarun.report(samples=N)`` appends one JSON line to per call (set by ``numarun tune``)."""

WATCH_INTERVAL = "NUMARUN_WATCH_INTERVAL"
"""Seconds between the binding watcher's checks in every worker (``0``: off; unset: 30)."""
TAR_MAX_BYTES = "NUMARUN_TAR_MAX_BYTES"
"""Cap on the bytes a topology tarball may extract to (default 1 GiB)."""
TAR_MAX_MEMBERS = "NUMARUN_TAR_MAX_MEMBERS"
"""Cap on the members of a topology tarball (default 200,000)."""
LAUNCHER_PID = "NUMARUN_LAUNCHER_PID"
"""Pid of the numarun process that started the worker; a worker whose parent is not it ends."""
STATE_DIR = "NUMARUN_STATE_DIR"
"""numarun's private directory for this run (0700, removed on every exit): workers record their exit there."""
SLURM_TIMEOUT = "NUMARUN_SLURM_TIMEOUT"
"""Seconds each Slurm client call of ``numarun submit`` may take (default 60)."""
SLURM_INFO = "NUMARUN_SLURM_INFO"
"""A directory holding the job's ``scontrol show topology`` (``topology``) and ``scontrol -o show node``
(``nodes``) answers, written once by ``numarun submit``'s batch script for every node's task."""
RDZV_MARGIN = "NUMARUN_RDZV_MARGIN"
"""Seconds numarun waits past torch's rendezvous timeout before it ends a rendezvous that hangs (default 15)."""
READY_FD = "NUMARUN_READY_FD"
"""A pipe (file descriptor) numarun writes one byte to once its signal handlers are in place: the relay
that started it (the Slurm node task, numarun as PID 1) holds the signals it gets until then."""
INIT = "NUMARUN_INIT"
"""``1``: this numarun's parent is numarun as PID 1, which reaps orphans (so this one is no subreaper)."""
DETECT = "NUMARUN_DETECT"
"""``0``: do not read the job's shape from a scheduler's environment (Slurm step, mpirun); ``--no-detect``."""
PLAN_JSON = "NUMARUN_PLAN_JSON"
"""The plan itself (JSON) when there is no plan file: a rank started by the scheduler (per-rank mode)."""

ALL: tuple[str, ...] = tuple(
    v for k, v in sorted(globals().items()) if k.isupper() and isinstance(v, str) and v.startswith("NUMARUN_")
)
"""Every variable above."""
