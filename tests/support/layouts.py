"""Layouts' test helpers: the placement objective written again from its statement (docs/layouts.md), apart from
numarun's code, and constructed machines with chosen GPU links."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math

from topo_helpers import FIXTURES, build_topology

from numarun.layout import PRIORITY
from numarun.topology.discover import merge_nvml
from numarun.topology.links import gpu_links
from numarun.topology.model import Gpu, Topology
from numarun.topology.nvml import reading_from_record
from numarun.topology.visible import visible_gpus


@functools.cache
def groups_of(shape: tuple[int, ...], dim: int) -> list[list[int]]:
    """Ranks that differ only in coordinate ``dim`` of the row-major mesh (numpy.unravel_index order)."""
    out: dict[tuple[int, ...], list[int]] = {}
    for rank in range(math.prod(shape)):
        coords, rest = [], rank
        for size in reversed(shape):
            coords.append(rest % size)
            rest //= size
        coords.reverse()
        out.setdefault(tuple(c for i, c in enumerate(coords) if i != dim), []).append(rank)
    return list(out.values())


@functools.cache
def pairs_of(names: tuple[str, ...], shape: tuple[int, ...]) -> list[list[list[tuple[int, int]]]]:
    """Per counted dimension in priority order, per group, its pairs of ranks."""
    return [
        [[(a, b) for a in g for b in g if a < b] for g in groups_of(shape, names.index(name))]
        for name in PRIORITY
        if name in names and shape[names.index(name)] > 1
    ]


def objective(names: tuple[str, ...], shape: tuple[int, ...], cls, gpus) -> tuple:
    """``gpus[rank]`` the GPU (index into ``cls``) each rank drives."""
    return tuple(
        tuple(sorted((max(cls[gpus[a]][gpus[b]] for a, b in group) for group in dim), reverse=True))
        for dim in pairs_of(names, shape)
    )


def optimum(names, shape, cls):
    """(best value, today's order when it is best, else the first best placement in local-rank order)."""
    ranks = math.prod(shape)
    today = tuple(range(ranks))
    best, best_order = objective(names, shape, cls, today), today
    for order in itertools.permutations(range(len(cls)), ranks):
        v = objective(names, shape, cls, order)
        if v < best:
            best, best_order = v, order
    return best, best_order


def classes_of(topology: Topology, cuda_visible_devices: str | None = None) -> tuple[list[list[int]], tuple[Gpu, ...]]:
    links = gpu_links(topology)
    gpus = visible_gpus(topology, cuda_visible_devices, "PCI_BUS_ID")
    pos = [topology.gpus.index(g) for g in gpus]
    return [[int(links.link(a, b)) for b in pos] for a in pos], gpus


def with_links(topology: Topology, rows: list[str]) -> Topology:
    """``rows``: the upper triangle's codes, 'a-b=CODE' pairs; the rest SYS across NUMA nodes, NODE within."""
    n = len(topology.gpus)
    m = [
        [
            "X" if i == j else ("NODE" if topology.gpus[i].numa_node == topology.gpus[j].numa_node else "SYS")
            for j in range(n)
        ]
        for i in range(n)
    ]
    for item in rows:
        pair, code = item.split("=")
        a, b = map(int, pair.split("-"))
        m[a][b] = m[b][a] = code
    return dataclasses.replace(topology, gpu_links=tuple(map(tuple, m)))


def crossed() -> Topology:
    """4 GPUs on 2 NUMA nodes whose NVLinks cross the sockets (a recorded NVML reading)."""
    reading = reading_from_record(json.loads((FIXTURES / "nvml" / "constructed-4gpu-crossed-nvlink.json").read_text()))
    return merge_nvml(build_topology(nodes=2, cores_per_node=8, gpu_nodes=()), reading)
