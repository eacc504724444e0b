"""NIC choices as plan fields: ``numarun topo`` and ``numarun plan`` name the same NIC for every GPU,
the views draw from the fields, and plan files of version 1 (NIC choices only in env) still read."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest
from helpers import FIXTURES
from topo_helpers import build_topology, check_invariants, eth, ib, recorded_topologies

from numarun.errors import PlanError
from numarun.plan.binding import make_plan
from numarun.plan.model import PLAN_SCHEMA_VERSION, BindingMode, LaunchPlan, NicPolicy, PlanRequest
from numarun.topology.discover import load_topology
from numarun.topology.model import Topology
from numarun.view.plan import nic_lines, render_plan
from numarun.view.svg import render_svg
from numarun.view.topo import render_text

ALL = recorded_topologies()
WITH_NICS = {k: t for k, t in ALL.items() if t.gpus and t.nics}


def test_the_recorded_machines_with_gpus_and_nics_are_there() -> None:
    assert len(WITH_NICS) >= 10
    assert {k.split("/")[0] for k in WITH_NICS} == {"smi", "hwloc", "sysfs"}


def _topo_nic_column(topology: Topology) -> dict[int, str]:
    """GPU index -> the "nearest NIC" cell, as ``numarun topo`` prints it."""
    text = render_text(topology, width=1000)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if "nearest NIC" in line)
    names = [c.strip() for c in lines[head].split("┃")[1:-1]]
    col = names.index("nearest NIC")
    cells: dict[int, str] = {}
    for line in lines[head + 2 :]:
        if not line.startswith("│"):
            break
        row = [c.strip() for c in line.split("│")[1:-1]]
        cells[int(row[0])] = row[col]
    return cells


@pytest.mark.parametrize("name", sorted(WITH_NICS))
def test_topo_and_plan_name_the_same_nic_for_every_gpu(name: str) -> None:
    t = WITH_NICS[name]
    # the binding mode does not touch NICs; node mode plans even where cores are too few for exclusive
    plan = make_plan(t, PlanRequest(binding=BindingMode.NODE))
    topo = _topo_nic_column(t)
    assert len(plan.ranks) == len(t.gpus) == len(topo)
    for r in plan.ranks:
        assert r.gpu is not None
        cell = topo[r.gpu.index]
        shown = cell.split(" (")[0] if cell not in ("-", "unknown") else None
        assert shown == r.nic, f"GPU {r.gpu.index}: topo names {cell!r}, the plan {r.nic!r}"


def test_plan_table_and_nic_lines_come_from_the_fields() -> None:
    t = ALL["smi/dgx-a100-8numa-nps4-10nic"]
    plan = make_plan(t, PlanRequest())
    hca = "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert (
        plan.nccl_nics is not None and plan.nccl_nics.value == hca and plan.nccl_nics.nics == tuple(hca[1:].split(","))
    )
    assert nic_lines(plan) == [f"NCCL_IB_HCA={hca} (every rank)", "UCX_NET_DEVICES: the rank's NIC"]
    # the fields alone make the lines and the NIC column: a plan without its env renders the same
    bare = dataclasses.replace(plan, ranks=tuple(dataclasses.replace(r, env={}) for r in plan.ranks))
    assert nic_lines(bare) == nic_lines(plan)
    assert render_plan(bare).count("mlx5_") == render_plan(plan).count("mlx5_") > 8
    per_rank = make_plan(t, PlanRequest(nic_policy=NicPolicy.PER_RANK))
    assert per_rank.nccl_nics is None and all(r.nic_port == 0 for r in per_rank.ranks)
    assert nic_lines(per_rank) == ["NCCL_IB_HCA: one per rank (nic policy per-rank)"]


def test_a_variable_the_user_set_leaves_its_field_empty() -> None:
    t = ALL["smi/dgx-a100-8numa-nps4-10nic"]
    plan = make_plan(t, PlanRequest(user_env={"NCCL_IB_HCA": "=mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1"}))
    check_invariants(t, plan)
    assert plan.nccl_nics is None and all(r.nic_variables == () for r in plan.ranks)
    assert nic_lines(plan) == []
    assert any("NCCL_IB_HCA is set by the user" in w for w in plan.warnings)
    assert [r.nic for r in plan.ranks] == [f"mlx5_{i}" for i in range(8)]  # the choice stays in the plan


def test_svg_marks_the_node_list_whatever_its_variable() -> None:
    # eth1 sits on a node without GPUs: SYS to both, left out of the socket list
    t = build_topology(gpu_nodes=(0, 0), nics=(eth("eth0", 0), eth("eth1", 1)))
    plan = make_plan(t, PlanRequest())
    assert (
        plan.nccl_nics is not None
        and plan.nccl_nics.variable == "NCCL_SOCKET_IFNAME"
        and plan.nccl_nics.value == "=eth0"
    )
    root = ET.fromstring(render_svg(t, plan))
    marked = {e.get("data-nic") for e in root.iter() if "nccl" in (e.get("class") or "").split()}
    assert marked == {"eth0"}
    assert any((e.text or "") == "every rank: NCCL_SOCKET_IFNAME==eth0" for e in root.iter())
    ib_plan = make_plan(
        build_topology(nodes=3, nics=(ib("mlx5_0", 0), ib("mlx5_1", 1), ib("mlx5_2", 2))), PlanRequest()
    )
    assert ib_plan.nccl_nics is not None and ib_plan.nccl_nics.nics == ("mlx5_0", "mlx5_1")


# --- plan files of version 1 ---

V1_CASES = {
    "v1-dgx-a100-nps4-8numa.json": [],
    "v1-dgx-a100-nps4-per-rank-nic.json": ["per-rank"],
}


@pytest.mark.parametrize("name", sorted(V1_CASES))
def test_version_1_plan_files_read_with_their_nic_fields(name: str) -> None:
    text = (FIXTURES / "plans" / name).read_text()
    assert json.loads(text)["schema_version"] == 1
    old = LaunchPlan.from_json(text, origin=name)
    assert old.schema_version == PLAN_SCHEMA_VERSION == 2
    t = load_topology(str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"))
    policy = NicPolicy.PER_RANK if V1_CASES[name] else NicPolicy.NODE
    fresh = dataclasses.replace(make_plan(t, PlanRequest(nic_policy=policy)), topology_source=old.topology_source)
    # what the version-1 file kept in env is now in the fields, as a fresh plan has it
    assert old == fresh
    assert render_plan(old) == render_plan(fresh)
    assert LaunchPlan.from_json(old.to_json()) == old


def test_version_1_without_nic_variables_reads_with_empty_fields() -> None:
    data = json.loads((FIXTURES / "plans" / "v1-dgx-a100-nps4-8numa.json").read_text())
    for r in data["ranks"]:
        r["env"] = {"OMP_NUM_THREADS": r["env"]["OMP_NUM_THREADS"]}
    plan = LaunchPlan.from_json(json.dumps(data))
    assert plan.nccl_nics is None and all(r.nic_variables == () and r.nic_port == 0 for r in plan.ranks)
    assert [r.nic for r in plan.ranks] == [f"mlx5_{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"schema_version": 3}, "expected 1 or 2"),
        ({"schema_version": "1"}, "expected 1 or 2"),
        ({"schema_version": 1, "ranks": [{"local_rank": 0, "env": {"NCCL_IB_HCA": 7}}]}, "$.ranks[0]"),
        ({"schema_version": 2, "nccl_nics": {"variable": "NCCL_IB_HCA"}}, "nccl_nics"),
    ],
)
def test_bad_plan_files_are_one_line_errors(change: dict[str, object], needle: str) -> None:
    data = json.loads((FIXTURES / "plans" / "v1-dgx-a100-nps4-8numa.json").read_text())
    with pytest.raises(
        PlanError, match=r"^bad plan file 'p\.json': .*expected the output of 'numarun plan --json'$"
    ) as e:
        LaunchPlan.from_json(json.dumps({**data, **change}), origin="p.json")
    assert needle in str(e.value) and "\n" not in str(e.value)
