"""The launch options a source stated, against the job found in the environment. Pure.

What no source stated is taken from the scheduler; a stated value is used when it agrees, and is
one line naming both values when it does not (:class:`JobConflict`). Per-node mode settles
torchrun's rendezvous (:func:`settle_node`); per-rank mode checks that no option asks for what
only torchrun's agent does, and builds the environment torchrun gives its workers (:func:`rank_env`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..argtypes import NodeRange
from ..errors import JobConflict, UsageError
from ..options.launch import Setting
from .model import JobShape, Mode, Scheduler
from .slurm import node_order, rendezvous_port

TORCHRUN_DEFAULT_PORT = 29500
"""The port torchrun gives a static rendezvous without --master-port (torch.distributed.run.config_from_args)."""


Stated = Mapping[str, Setting]
"""The settings a source other than the default gave, by option dest."""


def _stated(stated: Stated, dest: str) -> Any:
    s = stated.get(dest)
    return None if s is None else s.value


def _flag(stated: Stated, dest: str) -> str:
    s = stated.get(dest)
    return s.where if s is not None else "--" + dest.replace("_", "-")


@dataclass(frozen=True)
class NodeRendezvous:
    """Per-node mode: torchrun's rendezvous for this node."""

    nnodes: int
    node_rank: int
    head: str
    """The node that gets node rank 0 ('' when the scheduler does not name nodes)."""
    master_addr: str | None
    """None: the head's address is still to be found (its NodeAddr)."""
    master_port: int | None
    own_rendezvous: bool
    """The user's own rendezvous (``--rdzv-endpoint``, c10d, ``--standalone``) is kept: only --nnodes is set."""
    order: tuple[str, ...] = ()

    def options(self, master_addr: str | None = None) -> dict[str, object]:
        """torchrun option dests to set (``master_addr`` fills a head address found since)."""
        if self.own_rendezvous:
            return {"nnodes": NodeRange.of(self.nnodes)}
        addr = self.master_addr or master_addr
        if addr is None:
            raise UsageError(f"no address for the head node {self.head!r}: expected --master-addr HOST")
        return {
            "nnodes": NodeRange.of(self.nnodes),
            "node_rank": self.node_rank,
            "rdzv_backend": "static",
            "master_addr": addr,
            "master_port": self.master_port,
            "rdzv_endpoint": "",
        }


def _who(shape: JobShape) -> str:
    return f"Slurm step {shape.job}" if shape.scheduler is Scheduler.SLURM else shape.describe().split(":")[0]


def _check_shape(shape: JobShape, stated: Stated) -> None:
    """The stated node count, --standalone and node rank against the scheduler's job."""
    nnodes: NodeRange | None = _stated(stated, "nnodes")
    if nnodes is not None and shape.nnodes not in nnodes:
        tasks = "one task each" if shape.mode is Mode.PER_NODE else f"{shape.world_size} tasks"
        flag = _flag(stated, "nnodes")
        raise JobConflict(
            f"bad {flag} {str(nnodes)!r}: {_who(shape)} runs on {shape.nnodes} node{'s' if shape.nnodes != 1 else ''} "
            f"({tasks}); expected {flag} {shape.nnodes} or no {flag} (numarun reads it from the scheduler)"
        )
    if _stated(stated, "standalone") and shape.nnodes > 1:
        raise JobConflict(
            f"bad option {_flag(stated, 'standalone')!r}: {_who(shape)} spans {shape.nnodes} nodes, and --standalone "
            "runs a job of one node; expected it left out (numarun joins the nodes of the step)"
        )
    node_rank = _stated(stated, "node_rank")
    if node_rank is None or node_rank == shape.node_index:
        return
    if shape.scheduler is Scheduler.SLURM:
        hint = (
            "; was $SLURM_NODEID expanded by the batch shell before srun? Quote it "
            "(srun bash -c '... --node-rank $SLURM_NODEID ...') or leave --node-rank out: numarun reads it from Slurm"
        )
        where = f"this task runs on {shape.node_name} (SLURM_NODEID {shape.node_index} of {_who(shape)})"
    else:
        hint = "; leave --node-rank out: numarun reads it from the scheduler"
        where = f"this process is on node {shape.node_index} of {_who(shape)}"
    raise JobConflict(f"bad {_flag(stated, 'node_rank')} {node_rank}: {where}{hint}", node_varying=True)


def own_rendezvous(stated: Stated) -> bool:
    """The user's own rendezvous (``--rdzv-endpoint``, c10d, ``--standalone``): the job sets only the node count."""
    return bool(_stated(stated, "rdzv_endpoint") or _stated(stated, "standalone")) or (
        _stated(stated, "rdzv_backend") not in (None, "static")
    )


def settle_node(shape: JobShape, stated: Stated, *, leaf_switch: Mapping[str, str] | None = None) -> NodeRendezvous:
    """Per-node mode: the rendezvous of this node, from the stated options and the scheduler's job.

    The node rank is the node's index in Slurm's order, regrouped by leaf switch (``leaf_switch``,
    from ``scontrol show topology``) unless ``--node-rank`` was stated (checked against
    ``SLURM_NODEID``). The head is node rank 0, the port derives from the job and step ids.
    ``MASTER_ADDR``/``MASTER_PORT`` in the job's environment are stated options (the options model reads them).
    """
    _check_shape(shape, stated)
    own = own_rendezvous(stated)
    if own:  # the order is the one the nodes' keys give a c10d rendezvous with a layout
        order = tuple(node_order(shape.nodes, leaf_switch)) if leaf_switch is not None and shape.nodes else ()
    elif shape.nodes:
        order = shape.nodes if "node_rank" in stated else tuple(node_order(shape.nodes, leaf_switch))
    else:  # MPI: the rank of a one-process-per-node job is its node
        order = ()
    ranked = bool(order) and not own  # the node rank and the head from the order
    addr, port = (None, None) if own else rank_master(shape, stated, nodes=order)
    return NodeRendezvous(
        nnodes=shape.nnodes,
        node_rank=order.index(shape.node_name) if ranked else shape.node_index,
        head=order[0] if ranked else "",
        master_addr=addr,
        master_port=port,
        own_rendezvous=own,
        order=order,
    )


def check_rank(shape: JobShape, stated: Stated, *, per_rank: Collection[str]) -> None:
    """Per-rank mode: the options must not contradict the scheduler nor ask for torchrun's agent (any option
    but those of ``per_rank``, which make sense when the scheduler starts every rank)."""
    nproc = _stated(stated, "nproc_per_node")
    if nproc is not None and nproc != 1:
        raise JobConflict(
            f"bad {_flag(stated, 'nproc_per_node')} {nproc}: {_who(shape)} already starts {shape.local_world_size} "
            f"task{'s' if shape.local_world_size != 1 else ''} on this node, each one rank (per-rank mode); expected "
            "no "
            "--nproc-per-node, or one task per node (srun --ntasks-per-node=1) for numarun to start the node's ranks"
        )
    if shape.node_index >= 0:  # else checked again once the ranks agree on it
        _check_shape(shape, stated)
    agent = sorted(s.where for d, s in stated.items() if d not in per_rank)
    if agent:
        raise JobConflict(
            f"bad option {agent[0]!r}: in per-rank mode ({_who(shape)} starts every rank itself) numarun starts no "
            "torchrun "
            "agent, which that option configures; expected it left out, or one task per node for numarun to start the "
            "ranks"
        )


def rank_master(shape: JobShape, stated: Stated, *, nodes: object = None) -> tuple[str | None, int]:
    """(MASTER_ADDR or None when it is the head's address to look up, MASTER_PORT) of the job; ``nodes``: the
    node order (per-rank mode: the scheduler's)."""
    nodes = shape.nodes if nodes is None else nodes
    addr = _stated(stated, "master_addr") or None
    if addr is None and not nodes:  # MPI: no node names to look rank 0's up by
        if shape.nnodes != 1:
            raise UsageError(
                f"no address for rank 0's node: {shape.describe().split(':')[0]} spans {shape.nnodes} nodes and the "
                "MPI "
                "launcher does not say where rank 0 runs; expected --master-addr HOST or MASTER_ADDR in the "
                "environment "
                "(e.g. mpirun -x MASTER_ADDR=$(hostname) ...)"
            )
        addr = "127.0.0.1"
    derived = rendezvous_port(shape.job_id, shape.step_id or 0) if shape.job_id is not None else TORCHRUN_DEFAULT_PORT
    return addr, _stated(stated, "master_port") or derived


def rank_env(shape: JobShape, *, master_addr: str, master_port: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables torchrun gives each worker, from the scheduler's numbering (per-rank mode); the node's
    (``GROUP_RANK``, ``GROUP_WORLD_SIZE``) only once known (an MPI launcher does not say: the ranks agree on it)."""
    group = (
        {"GROUP_RANK": str(shape.node_index), "GROUP_WORLD_SIZE": str(shape.nnodes)} if shape.node_index >= 0 else {}
    )
    return {
        "RANK": str(shape.rank),
        "LOCAL_RANK": str(shape.local_rank),
        "WORLD_SIZE": str(shape.world_size),
        "LOCAL_WORLD_SIZE": str(shape.local_world_size),
        **group,
        "ROLE_NAME": "default",
        "ROLE_RANK": str(shape.rank),
        "ROLE_WORLD_SIZE": str(shape.world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": shape.job or "none",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
