"""Property test: any matrix written the way nvidia-smi (or a terminal copy) writes it
parses back to the same cells, whatever the separators."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.cpuset import format_list
from numarun.topology.model import Topology
from numarun.topology.smi import parse_topo_m, topology_from_smi

CODES = st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS", "NV1", "NV4", "NV12", "NV18"])


@st.composite
def matrices(draw):
    ng = draw(st.integers(1, 6))
    nn = draw(st.integers(0, 4))
    nd = ng + nn
    cells = [["X" if i == j else draw(CODES) for j in range(nd)] for i in range(nd)]
    cpus = [tuple(sorted(draw(st.sets(st.integers(0, 255), min_size=1, max_size=12)))) for _ in range(ng)]
    numa = [draw(st.one_of(st.none(), st.integers(0, 7))) for _ in range(ng)]
    gnuma = [draw(st.one_of(st.none(), st.integers(0, 255))) for _ in range(ng)]
    names = [draw(st.from_regex(r"mlx5_[a-z0-9_]{1,6}", fullmatch=True)) for _ in range(nn)]
    tabs = draw(st.booleans())
    return ng, nn, cells, cpus, numa, gnuma, names, tabs


def render(ng, nn, cells, cpus, numa, gnuma, names, tabs) -> str:
    labels = [f"GPU{i}" for i in range(ng)] + [f"NIC{i}" for i in range(nn)]
    sep = "\t" if tabs else "    "
    x = " X " if tabs else " X"
    lines = [sep + sep.join(labels + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i, label in enumerate(labels):
        row = [label] + [x if c == "X" else c for c in cells[i]]
        if i < ng:
            row += [
                format_list(cpus[i]),
                "N/A" if numa[i] is None else str(numa[i]),
                "",
                "N/A" if gnuma[i] is None else str(gnuma[i]),
            ]
        lines.append(sep.join(row) + ("" if tabs else " "))
    if nn:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{i}: {n}" for i, n in enumerate(names)]
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_render_then_parse(m) -> None:
    ng, nn, cells, cpus, numa, gnuma, names, tabs = m
    mx = parse_topo_m(render(*m), "prop")
    assert mx.gpu_links == tuple(tuple(r[:ng]) for r in cells[:ng])
    assert mx.nic_links == tuple(tuple(r[ng:]) for r in cells[:ng])
    assert mx.cpu_affinity == tuple(cpus)
    assert mx.numa_affinity == tuple(() if n is None else (n,) for n in numa)
    assert mx.gpu_numa_id == tuple(-1 if g is None else g for g in gnuma)
    assert mx.nic_names == tuple(names)
    t = topology_from_smi(render(*m), "prop")
    assert Topology.from_json(t.to_json()) == t
    assert {c.id for c in t.cpus} == set().union(*cpus)
