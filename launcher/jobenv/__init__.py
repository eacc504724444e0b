"""Where the job came from: a Slurm step, mpirun, or nothing. Pure functions of the environment.

numarun is often not what starts the job: a user's own sbatch script runs ``srun numarun ...``,
Slurm starts one task per GPU, ``mpirun`` starts the ranks. :func:`detect` reads the scheduler's
variables into a :class:`JobShape` (which node, how many tasks, which rank), and
:mod:`numarun.jobenv.settle` reconciles it with the user's options: one task per node is a node
whose ranks numarun starts (per-node mode); one task per rank binds itself and runs the script
(per-rank mode). Options that contradict the scheduler are one line and exit 2, never a hang.

``NUMARUN_DETECT=0`` (or ``--no-detect``) turns detection off: the option ``detect`` (:mod:`numarun.options.launch`).
"""

from __future__ import annotations

from collections.abc import Mapping

from . import mpi, slurm
from .model import JobShape, Mode, Scheduler

__all__ = ["JobShape", "Mode", "Scheduler", "detect", "scheduler_in"]


def scheduler_in(environ: Mapping[str, str]) -> Scheduler | None:
    """The scheduler this process was started by, from the variables alone (no validation).

    An MPI launcher's variables win over Slurm's: ``mpirun`` inside an allocation starts its
    daemons with ``srun``, so the ranks also carry the daemons' Slurm step, which does not
    describe them. MPICH's variables under ``srun --mpi=pmi2`` describe the same tasks as Slurm's,
    whose richer shape (node names, GPUs) is then used.
    """
    which = mpi.which(environ)
    if which is Scheduler.OPENMPI:
        return which
    in_step = slurm.in_step(environ)
    if which is not None and in_step:
        same = environ.get("SLURM_PROCID") == environ.get("PMI_RANK", environ.get("PMIX_RANK")) and (
            which is Scheduler.PMIX
            or environ.get("SLURM_NTASKS", environ.get("SLURM_STEP_NUM_TASKS")) == environ.get("PMI_SIZE")
        )
        return Scheduler.SLURM if same else which
    return which or (Scheduler.SLURM if in_step else None)


def detect(environ: Mapping[str, str], *, nproc_given: bool = False) -> JobShape | None:
    """The job this process is part of; None when no scheduler started it.

    Raises a one-line :class:`~numarun.errors.NumarunError` for a malformed scheduler environment.
    ``nproc_given``: ``--nproc-per-node`` was given (one MPI process per node then starts ranks).
    """
    which = scheduler_in(environ)
    if which is None:
        return None
    if which is Scheduler.SLURM:
        return slurm.shape_from_env(environ)
    return mpi.shape_from_env(environ, which, nproc_given=nproc_given)
