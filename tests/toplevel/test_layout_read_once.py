"""The layout's text is read in one place, where the options are read; the plan carries the layout on, and the
bootstrap and ``numarun.init()`` take it from the plan, never from the text again."""

from __future__ import annotations

import ast

import pytest
from helpers import FIXTURES, REPO

from numarun import envvars
from numarun.argtypes import NodeRange
from numarun.comm.context import _current_plan
from numarun.layout import Layout
from numarun.plan.binding import make_plan
from numarun.plan.model import PlanRequest
from numarun.topology.discover import load_topology
from numarun.worker.bootstrap import apply_mesh

LAUNCHER = REPO / "launcher"
PCIE8 = FIXTURES / "nvidia-smi" / "pcie-8gpu-pix-phb-sys-2x14c.txt"


def test_the_text_has_one_reader_and_the_options_are_its_one_caller() -> None:
    callers = sorted(
        str(path.relative_to(LAUNCHER))
        for path in LAUNCHER.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "parse" and getattr(node.value, "id", "") == "Layout"
    )
    assert callers == ["options/launch.py"]
    assert "NUMARUN_MESH" not in (LAUNCHER / "comm" / "context.py").read_text()  # init reads the plan


def test_the_ranks_read_the_plans_layout_not_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(
        load_topology(str(PCIE8)),
        PlanRequest(mesh=Layout.parse("dp_shard=-1,tp=2", where="--mesh"), nnodes=NodeRange(1, 2), nproc_per_node=4),
    )
    assert plan.mesh is not None and plan.mesh.layout == Layout(("dp_shard", "tp"), (-1, 2))
    env = {"WORLD_SIZE": "8", envvars.MESH: "tp=8"}  # a stale variable: the plan's layout wins
    apply_mesh(plan, env)
    assert (env[envvars.MESH], env[envvars.MESH_SHAPE]) == ("dp_shard=4,tp=2", "4,2")
    monkeypatch.setenv(envvars.PLAN_JSON, plan.to_json())
    monkeypatch.delenv(envvars.PLAN, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv(envvars.MESH, "not a layout")
    binding, layout = _current_plan()
    assert binding is not None and binding.local_rank == 1
    assert layout == Layout(("dp_shard", "tp"), (-1, 2)) and layout.where == f"{envvars.PLAN} layout"
