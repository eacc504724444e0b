"""An MPI job, read from the variables its launcher gives each rank. Pure.

- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``;
- MPICH's and Intel MPI's Hydra ``mpiexec``: ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
  ``MPI_LOCALNRANKS``;
- other PMIx launchers: ``PMIX_RANK``, with the job's size from ``WORLD_SIZE`` and
  ``LOCAL_WORLD_SIZE`` (PMIx itself gives the size only through its library).

Every process is one rank (per-rank mode), except one process per node (local size 1) asked
to start several ranks with ``--nproc-per-node``: then it is a node (per-node mode). MPI does
not say which node a rank is on: on one node it is 0; on several, a rank's node index and the
node count are -1 and 0 here, and the ranks agree on them before the script
(:func:`numarun.launch.rank.agree`), whatever the mapping and however uneven the nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import UsageError
from .model import OPT_OUT, JobShape, Mode, Scheduler

_VARS = {
    Scheduler.OPENMPI: (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    Scheduler.MPICH: ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    Scheduler.PMIX: ("PMIX_RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
}


def which(environ: Mapping[str, str]) -> Scheduler | None:
    """The MPI launcher that started this process, if any (Open MPI, then MPICH/Intel MPI, then PMIx)."""
    if "OMPI_COMM_WORLD_SIZE" in environ or "OMPI_COMM_WORLD_RANK" in environ:
        return Scheduler.OPENMPI
    if "PMI_RANK" in environ and "PMI_SIZE" in environ:
        return Scheduler.MPICH
    if "PMIX_RANK" in environ:
        return Scheduler.PMIX
    return None


def _int(environ: Mapping[str, str], name: str, scheduler: Scheduler, *, low: int = 0, below: int | None = None) -> int:
    value = environ.get(name)
    text = (value or "").strip()
    ok = (
        text.isdigit()
        and text.isascii()
        and len(text) <= 9
        and int(text) >= low
        and (below is None or int(text) < below)
    )
    if not ok:
        form = f"a whole number from {low} to {below - 1}" if below is not None else f"a whole number >= {low}"
        if value is None:
            form += f" ({scheduler.value} sets it for every rank)"
        raise UsageError(f"bad {scheduler.value} environment: {name} {value!r}: expected {form} ({OPT_OUT})")
    return int(text)


def shape_from_env(environ: Mapping[str, str], scheduler: Scheduler, *, nproc_given: bool = False) -> JobShape:
    """This rank's place in the MPI job. Raises :class:`UsageError` (one line) for a malformed environment."""
    rank_var, size_var, local_var, local_size_var = _VARS[scheduler]
    size = _int(environ, size_var, scheduler, low=1)
    rank = _int(environ, rank_var, scheduler, below=size)
    local_size = _int(environ, local_size_var, scheduler, low=1, below=size + 1)
    local_rank = _int(environ, local_var, scheduler, below=local_size)
    per_node = local_size == 1 and nproc_given
    nnodes, node_index = (1, 0) if local_size == size else (size, rank) if per_node else (0, -1)
    mode = Mode.PER_NODE if per_node else Mode.PER_RANK
    job = environ.get("PMIX_NAMESPACE", "") if scheduler is not Scheduler.MPICH else ""
    return JobShape(
        scheduler=scheduler,
        mode=mode,
        job=job,
        nnodes=nnodes,
        node_index=node_index,
        nodes=(),
        node_name="",
        rank=rank,
        local_rank=local_rank,
        world_size=size,
        local_world_size=local_size,
    )
