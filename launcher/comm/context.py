"""``numarun.init()``: one call in the worker sets up the distributed state from numarun's plan, or torchrun's
environment."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import DistInitError, NumarunError, expected
from .collectives import TensorForms
from .groups import GroupLayout, RankOnNode, create_groups, layout_from_places

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from ..layout import Layout
    from ..plan.model import RankBinding

log = logging.getLogger(__name__)

_CONTEXT: DistContext | None = None


@dataclass(frozen=True, eq=False)
class DistContext:
    """What a worker needs to know about the job, and its process groups."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    num_nodes: int
    local_world_size: int
    backend: str
    device: torch.device
    binding: RankBinding | None  # None under plain torchrun
    layout: GroupLayout
    intra_group: dist.ProcessGroup | None
    inter_group: dist.ProcessGroup | None  # None when nodes differ in size
    mesh: Any  # DeviceMesh: the layout's names with one (--mesh), else ("inter", "intra"); None when nodes differ
    # used by one thread at a time, as collectives on these groups are: the caller's, or the bucket stream's
    tensor_forms: TensorForms = field(default_factory=TensorForms, repr=False)
    mesh_layout: Layout | None = None  # the plan's layout, each size known; None without one

    @property
    def hierarchical_ok(self) -> bool:
        return self.layout.uniform

    def require_hierarchical(self) -> None:
        self.layout.require_uniform()


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise DistInitError(
                f"bad environment: {name} is not set; expected to run under numarun or torchrun "
                "(they set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)"
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistInitError(expected(raw, "an integer", what=name)) from None


def _current_plan() -> tuple[RankBinding | None, Layout | None]:
    """This rank's binding and the job's layout, from numarun's plan; (None, None) without one."""
    from ..worker import load_plan, rank_binding

    try:
        plan = load_plan()
        if plan is None:
            return None, None
        return rank_binding(plan, os.environ), plan.mesh.layout if plan.mesh is not None else None
    except NumarunError:
        raise
    except Exception as e:  # a broken plan file must not stop a job that only wants groups
        log.warning("could not read this rank's binding: %s", e)
        return None, None


def restart_store(environ: Mapping[str, str], *, world_size: int, timeout: timedelta | None) -> Any:
    """The agent's store under a prefix of this restart's own, or None (torch's default).

    torchrun hands every restart the same unprefixed store (pytorch/pytorch#135712): a group made after a restart
    could read the previous attempt's addresses and wait forever on a dead peer.
    """
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in environ:
        return None
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        port = int(environ.get("MASTER_PORT", ""))
    except ValueError:
        return None
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    client = dist.TCPStore(environ["MASTER_ADDR"], port, world_size, False, timeout or default_pg_timeout)
    return dist.PrefixStore(f"numarun/attempt_{restart}", client)


def current_context() -> DistContext | None:
    return _CONTEXT


def init(backend: str | None = None, *, timeout: timedelta | None = None, build_mesh: bool = True) -> DistContext:
    """Initialise torch.distributed from torchrun's environment and build the hierarchical groups; idempotent.

    ``backend`` None: NCCL when this rank has a GPU (in its binding, with a plan), else gloo. With a layout
    (``--mesh``, the trainer's; the plan carries it to the ranks), ``mesh`` is its DeviceMesh: the declared names,
    the contiguous row-major mesh ``init_device_mesh(device_type, shape, mesh_dim_names=names)`` builds (numarun
    placed it by choosing each rank's GPU); else the ("inter", "intra") mesh of nodes and local ranks.
    """
    global _CONTEXT
    if _CONTEXT is not None:
        if backend is not None and backend != _CONTEXT.backend:
            log.warning("numarun.init(backend=%r) ignored: already initialised with %r", backend, _CONTEXT.backend)
        return _CONTEXT

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    binding, declared = _current_plan()

    cuda_index: int | None = None
    if torch.cuda.is_available():
        if binding is not None:
            cuda_index = binding.gpu.cuda_index if binding.gpu is not None else None
        elif local_rank < torch.cuda.device_count():
            cuda_index = local_rank
    if backend is None:
        backend = "nccl" if cuda_index is not None else "gloo"
    if backend not in ("nccl", "gloo", "mpi", "ucc", "xccl") and ":" not in backend:
        raise DistInitError(expected(backend, "nccl, gloo (or another torch.distributed backend name)", "backend"))
    if backend == "nccl" and cuda_index is None:
        raise DistInitError(f"bad backend 'nccl' for local rank {local_rank}: it has no GPU; expected backend='gloo'")
    device = torch.device("cpu") if cuda_index is None else torch.device("cuda", cuda_index)
    if cuda_index is not None:
        torch.cuda.set_device(cuda_index)

    if not dist.is_initialized():
        options = {
            "timeout": timeout,
            "device_id": device if device.type == "cuda" else None,
            "store": restart_store(os.environ, world_size=world_size, timeout=timeout),
        }
        given = {k: v for k, v in options.items() if v is not None}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **given)
    elif dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise DistInitError(
            f"bad process group: rank {dist.get_rank()}/{dist.get_world_size()} already initialised, "
            f"expected RANK={rank} WORLD_SIZE={world_size} from the environment"
        )

    node_rank = _env_int("GROUP_RANK", _env_int("NODE_RANK", -1))
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 0)
    mine = torch.tensor([node_rank, local_rank, local_world_size], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    rows = [tuple(int(v) for v in t.tolist()) for t in gathered]
    if any(r[0] < 0 for r in rows):  # no node rank (launched by hand): torchrun's contiguous numbering
        lws = [r[2] for r in rows]
        if len(set(lws)) != 1 or lws[0] <= 0:
            raise DistInitError(
                f"bad environment: GROUP_RANK unset and LOCAL_WORLD_SIZE {sorted(set(lws))} differs or is unset; "
                "expected to run under numarun or torchrun"
            )
        rows = [(r // lws[0], r % lws[0], lws[0]) for r in range(world_size)]
    layout = layout_from_places([RankOnNode(r[0], r[1]) for r in rows])
    for r, row in enumerate(rows):
        if row[2] and row[2] != len(layout.intra_of(r)):
            raise DistInitError(
                f"bad LOCAL_WORLD_SIZE {row[2]} on rank {r}: its node has {len(layout.intra_of(r))} ranks"
            )
    me = layout.places[rank]
    mesh_layout = job_layout(declared, world_size=world_size, node_sizes=layout.node_sizes)
    intra, inter = create_groups(layout, rank)
    mesh = None
    if build_mesh and mesh_layout is not None:  # public torch API: the contiguous row-major mesh over the names
        mesh = init_device_mesh(device.type, mesh_layout.shape, mesh_dim_names=mesh_layout.names)
    elif build_mesh and layout.uniform:
        mesh = _make_mesh(layout, intra, inter, device)
    if not layout.uniform:
        log.warning(
            "nodes run %s ranks: flat collectives only (no inter-node groups, no device mesh)", layout.node_sizes
        )
    _CONTEXT = DistContext(
        rank=rank,
        local_rank=me.local_rank,
        world_size=world_size,
        node_rank=me.node_rank,
        num_nodes=layout.num_nodes,
        local_world_size=len(layout.intra_of(rank)),
        backend=str(dist.get_backend()),
        device=device,
        binding=binding,
        layout=layout,
        intra_group=intra,
        inter_group=inter,
        mesh=mesh,
        mesh_layout=mesh_layout,
    )
    log.info(
        "rank %d: node %d/%d, local rank %d/%d, backend %s, device %s",
        rank,
        me.node_rank,
        layout.num_nodes,
        me.local_rank,
        _CONTEXT.local_world_size,
        _CONTEXT.backend,
        device,
    )
    return _CONTEXT


def job_layout(declared: Layout | None, *, world_size: int, node_sizes: tuple[int, ...]) -> Layout | None:
    """The plan's layout checked against the job: the same rank count on every node, sizes that multiply to the
    world and fit the nodes, each size known; None without one."""
    from ..layout import node_cut

    if declared is None:
        return None
    if len(set(node_sizes)) != 1:
        raise DistInitError(
            f"bad {declared.where} {declared.text!r}: nodes run {','.join(map(str, node_sizes))} ranks; expected the "
            "same number of ranks on every node for a layout (the same --nproc-per-node everywhere)"
        )
    resolved = declared.resolved(world_size)
    node_cut(resolved, node_sizes[0])
    return resolved


def _make_mesh(layout: GroupLayout, intra: Any, inter: Any, device: torch.device) -> Any:
    """A 2D DeviceMesh over our own groups (no second set of communicators)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    mesh = torch.tensor([list(ranks) for ranks in layout.intra], dtype=torch.int64)  # rows = nodes
    try:
        return DeviceMesh.from_group([inter, intra], device.type, mesh=mesh, mesh_dim_names=("inter", "intra"))
    except Exception as e:  # an API change must not break init(): fall back to torch's own constructor
        log.debug("DeviceMesh.from_group failed (%s); using init_device_mesh", e)
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            device.type, (layout.num_nodes, layout.local_world_size), mesh_dim_names=("inter", "intra")
        )


def destroy() -> None:
    """Tear down the default process group and forget the context (tests, clean exits)."""
    global _CONTEXT
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTEXT = None


__all__ = ["DistContext", "current_context", "destroy", "init"]
