"""A Slurm job step, read from the variables ``srun`` gives each task. Pure.

``srun`` (and ``sbatch``'s own steps) set, in every task:

- ``SLURM_JOB_ID``, ``SLURM_STEP_ID``: the step (an ``salloc`` shell or the batch script itself has
  no ``SLURM_STEP_ID``: it is not a step, and numarun does not treat it as one);
- ``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NUM_TASKS``,
  ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``): the step's shape;
- ``SLURM_NODEID`` (this node's index in the step's node list), ``SLURMD_NODENAME``,
  ``SLURM_PROCID`` (the task's rank), ``SLURM_LOCALID`` (its index on the node);
- ``SLURM_GPUS_ON_NODE``, ``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS``: GPU counts and ids, the ids
  being the ``/dev/nvidiaN`` minor numbers (not the PCI order).

Every task of a step with one task on each node is a node: numarun starts its ranks (per-node
mode). A step with more tasks than nodes is one rank per task (per-rank mode). The node order of
per-node mode is Slurm's, regrouped by leaf switch when ``topology/tree`` reports switches
(:func:`node_order`), so that the nodes under one switch get adjacent node ranks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..errors import SlurmError
from .hostlist import expand_hostlist
from .model import OPT_OUT, JobShape, Mode, Scheduler

PORT_BASE = 15000
"""Rendezvous ports lie in [PORT_BASE, PORT_BASE + PORT_SPAN): below Linux's ephemeral range (32768+)."""
PORT_SPAN = 15000
STEPS_PER_JOB = 32
"""Steps of one job that get distinct ports (two at a time: the rendezvous and the pre-flight's store)."""


def _bad(name: str, value: object, form: str) -> SlurmError:
    return SlurmError(
        f"bad Slurm environment: {name} {value!r}: expected {form} (numarun runs inside a Slurm step; {OPT_OUT})"
    )


def in_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of a Slurm job step (not an ``salloc`` shell or the batch script)."""
    return bool(environ.get("SLURM_JOB_ID")) and bool(environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID")))


def rendezvous_port(job_id: int, step_id: int = 0) -> int:
    """A port derived from the job and step ids: two steps of one job (up to :data:`STEPS_PER_JOB`)
    and neighbouring jobs on one head node do not collide. Even, so that port + 1 (the pre-flight's
    store) is the step's too."""
    slots = PORT_SPAN // 2
    return PORT_BASE + 2 * ((job_id * STEPS_PER_JOB + step_id % STEPS_PER_JOB) % slots)


def parse_tasks_per_node(text: str) -> list[int]:
    """``2(x3),1`` -> ``[2, 2, 2, 1]`` (``SLURM_STEP_TASKS_PER_NODE``, ``SLURM_TASKS_PER_NODE``)."""
    out: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise _bad("SLURM_STEP_TASKS_PER_NODE", text, "counts such as '2(x3),1'")
        count = int(m.group(2) or 1)
        if len(out) + count > 1_000_000:
            raise _bad("SLURM_STEP_TASKS_PER_NODE", text, "at most 1,000,000 nodes")
        out += [int(m.group(1))] * count
    return out


def _int(environ: Mapping[str, str], *names: str, low: int = 0) -> int | None:
    """The first of ``names`` that is set, as an integer >= ``low``; None when none is set."""
    for name in names:
        value = environ.get(name)
        if value is None:
            continue
        text = value.strip()
        if not text.isdigit() or not text.isascii() or len(text) > 12 or int(text) < low:
            raise _bad(name, value, f"a whole number >= {low}")
        return int(text)
    return None


def _ids(environ: Mapping[str, str], name: str) -> tuple[int, ...] | None:
    value = environ.get(name)
    if value is None or not value.strip():
        return None
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and p.isascii() and len(p) <= 6 for p in parts):
        return None  # not device numbers (a gres type, a UUID): leave GPU choice to CUDA_VISIBLE_DEVICES
    return tuple(int(p) for p in parts)


def shape_from_env(environ: Mapping[str, str]) -> JobShape:
    """The step this task belongs to. Raises :class:`SlurmError` (one line) for a malformed environment."""
    job_id = _int(environ, "SLURM_JOB_ID")
    step_text = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", ""))
    if not step_text.strip().isdigit():
        raise _bad("SLURM_STEP_ID", step_text, "a whole number (a task of an srun step)")
    step_id = int(step_text)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise _bad("SLURM_STEP_NODELIST", nodelist, "the step's node list, e.g. 'node[1-2]'")
    try:
        nodes = expand_hostlist(nodelist)
    except SlurmError:
        raise _bad("SLURM_STEP_NODELIST", nodelist, "a Slurm hostlist such as 'node[01-03,07]'") from None
    nnodes = _int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", low=1)
    if nnodes is not None and nnodes != len(nodes):
        raise _bad(
            "SLURM_STEP_NUM_NODES",
            str(nnodes),
            f"the number of nodes in SLURM_STEP_NODELIST {nodelist!r} ({len(nodes)})",
        )
    node_index = _int(environ, "SLURM_NODEID")
    if node_index is None or node_index >= len(nodes):
        raise _bad("SLURM_NODEID", environ.get("SLURM_NODEID"), f"a node index from 0 to {len(nodes) - 1}")
    name = environ.get("SLURMD_NODENAME") or nodes[node_index]
    if name != nodes[node_index]:
        raise _bad(
            "SLURMD_NODENAME", name, f"{nodes[node_index]!r}, node {node_index} of SLURM_STEP_NODELIST {nodelist!r}"
        )
    per_node_text = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    per_node = parse_tasks_per_node(per_node_text) if per_node_text else [1] * len(nodes)
    if len(per_node) != len(nodes):
        raise _bad("SLURM_STEP_TASKS_PER_NODE", per_node_text, f"one count per node of the step ({len(nodes)})")
    ntasks = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", low=1) or sum(per_node)
    if ntasks != sum(per_node):
        form = f"the sum of SLURM_STEP_TASKS_PER_NODE {per_node_text!r} ({sum(per_node)})"
        raise _bad("SLURM_STEP_NUM_TASKS", str(ntasks), form)
    local_size = per_node[node_index]
    rank = _int(environ, "SLURM_PROCID")
    if rank is None or rank >= ntasks:
        raise _bad("SLURM_PROCID", environ.get("SLURM_PROCID"), f"a task rank from 0 to {ntasks - 1}")
    local_rank = _int(environ, "SLURM_LOCALID")
    if local_rank is None or local_rank >= local_size:
        raise _bad(
            "SLURM_LOCALID", environ.get("SLURM_LOCALID"), f"a task index on this node from 0 to {local_size - 1}"
        )
    # One task on every node: each is a node (numarun starts its ranks). Decided on the whole
    # step's shape, so that every task of the step takes the same mode.
    mode = Mode.PER_NODE if ntasks == len(nodes) else Mode.PER_RANK
    return JobShape(
        scheduler=Scheduler.SLURM,
        mode=mode,
        job=f"{job_id}.{step_id}",
        nnodes=len(nodes),
        node_index=node_index,
        nodes=tuple(nodes),
        node_name=name,
        rank=rank,
        local_rank=local_rank,
        world_size=ntasks,
        local_world_size=local_size,
        job_id=job_id,
        step_id=step_id,
        gpus_on_node=_int(environ, "SLURM_GPUS_ON_NODE"),
        job_gpus=_ids(environ, "SLURM_JOB_GPUS"),
        step_gpus=_ids(environ, "SLURM_STEP_GPUS"),
    )


def parse_leaf_switches(text: str) -> dict[str, str]:
    """``scontrol show topology`` -> node name -> its leaf (Level=0) switch; under topology/block (Slurm 23.11+, the
    NVLink domains of GB200 NVL72 racks) its block, and ``block/switch`` where a node has both."""
    leaf: dict[str, str] = {}
    block: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "BlockName" in fields:  # topology/block
            into, name = block, fields["BlockName"]
        else:  # topology/tree: the leaf switches alone
            into, name = leaf, fields.get("SwitchName") if fields.get("Level") == "0" else None
        if name and "Nodes" in fields:
            for node in expand_hostlist(fields["Nodes"]):
                into.setdefault(node, name)
    for node, name in block.items():
        leaf[node] = f"{name}/{leaf[node]}" if node in leaf else name
    return leaf


def parse_node_addrs(text: str) -> dict[str, str]:
    """``scontrol [-o] show node LIST`` -> node name -> its NodeAddr (every node the text shows)."""
    addrs: dict[str, str] = {}
    name = None
    for m in re.finditer(r"\b(NodeName|NodeAddr)=(\S+)", text):
        if m.group(1) == "NodeName":
            name = m.group(2)
        elif name is not None:
            addrs.setdefault(name, m.group(2))
    return addrs


def node_order(nodes: Sequence[str], leaf_switch: Mapping[str, str] | None = None) -> list[str]:
    """The step's nodes in node-rank order.

    Slurm's order, except that nodes under one leaf switch are kept together: groups in the
    order of their first node in Slurm's list, Slurm's order inside each group. Without a
    switch map (or with one switch) this is exactly Slurm's order (node rank == SLURM_NODEID).
    Slurm's first node always stays first: it is the head in either order.
    """
    if not leaf_switch:
        return list(nodes)
    groups: dict[str, list[str]] = {}
    for n in nodes:
        groups.setdefault(leaf_switch.get(n, f"\0{n}"), []).append(n)
    return [n for group in groups.values() for n in group]
