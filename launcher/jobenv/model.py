"""The job numarun finds itself in: who started it, how many nodes and ranks, and where this process sits."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .. import envvars

OPT_OUT = f"{envvars.DETECT}=0 or --no-detect turns detection off"
"""How a message about the job's environment says to leave the job unread."""


class Scheduler(str, enum.Enum):
    """What started this process, read from the environment it was given."""

    SLURM = "slurm"
    """A Slurm job step (``srun``): ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` are set."""
    OPENMPI = "openmpi"
    """Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_*``."""
    MPICH = "mpich"
    """MPICH's or Intel MPI's Hydra ``mpiexec``: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
    ``MPI_LOCALNRANKS``."""
    PMIX = "pmix"
    """Another PMIx launcher: ``PMIX_RANK`` (the job's size from ``WORLD_SIZE``/``LOCAL_WORLD_SIZE``)."""


class Mode(str, enum.Enum):
    """How numarun runs inside the job it found."""

    PER_NODE = "per-node"
    """One numarun per node: it starts the node's ranks (torchrun's agent), as ``numarun submit`` does."""
    PER_RANK = "per-rank"
    """One process per rank, started by the scheduler: no agent; the process binds itself and runs the script."""


@dataclass(frozen=True)
class JobShape:
    """Where this process sits in the job, from the scheduler's variables alone (pure, no I/O).

    In per-node mode ``rank``/``local_rank`` are the task's own (one task per node); the node's
    ranks are then numbered by the launcher. In per-rank mode they are this process's.
    """

    scheduler: Scheduler
    mode: Mode
    job: str
    """``1234.0`` (Slurm job and step), or the MPI job's name; '' when the scheduler gives none."""
    nnodes: int
    """0 when unknown (an MPI job on several nodes, until its ranks agree)."""
    node_index: int
    """This node's index in the scheduler's node order (``SLURM_NODEID``); -1 when unknown."""
    nodes: tuple[str, ...]
    """The step's nodes in Slurm's order; () for MPI (it does not say)."""
    node_name: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    """Tasks on this node."""
    job_id: int | None = None
    step_id: int | None = None
    gpus_on_node: int | None = None
    """GPUs the job holds on this node (``SLURM_GPUS_ON_NODE``); None when not said."""
    job_gpus: tuple[int, ...] | None = None
    """The job's GPUs on this node as device minor numbers (``SLURM_JOB_GPUS``); None when not said."""
    step_gpus: tuple[int, ...] | None = None
    """The step's GPUs on this node as device minor numbers (``SLURM_STEP_GPUS``); None when not said."""

    def describe(self) -> str:
        """``Slurm step 1234.0: node 1 of 2, 2 tasks per node: per-rank mode`` (the first log line)."""
        what = {
            Scheduler.SLURM: f"Slurm step {self.job}",
            Scheduler.OPENMPI: "Open MPI job" + (f" {self.job}" if self.job else ""),
            Scheduler.MPICH: "MPICH/Intel MPI job",
            Scheduler.PMIX: "PMIx job" + (f" {self.job}" if self.job else ""),
        }[self.scheduler]
        where = f"node {self.node_index} of {self.nnodes}" if self.node_index >= 0 else "several nodes"
        tasks = f"{self.local_world_size} task{'' if self.local_world_size == 1 else 's'} on this node"
        if self.mode is Mode.PER_RANK:
            rank = f"rank {self.rank} of {self.world_size}, local rank {self.local_rank}"
            return f"{what}: {where}, {tasks}: per-rank mode ({rank})"
        return f"{what}: {where}, {tasks}: per-node mode"
