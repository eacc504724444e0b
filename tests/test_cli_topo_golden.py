"""Golden outputs of ``numarun topo``: the text view and a small picture.

Regenerate after an intended change with::

    NUMARUN_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_cli_topo_golden.py

and review the diff under ``tests/golden/topo/`` before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.plan.model import LaunchPlan
from launcher.topology.discover import load_topology
from launcher.topology.model import Topology
from launcher.topology.render import render_text
from launcher.topology.svg import render_svg

from test_topology_svg import make_topology, plan_for

GOLDEN = Path(__file__).parent / "golden" / "topo"
FIXTURES = Path(__file__).parent / "fixtures"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("NUMARUN_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"regenerated {path}")
    assert path.exists(), f"missing golden {path}: run with NUMARUN_REGEN_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden; see the module docstring"


def rich_topology() -> Topology:
    return make_topology(memory_only_nodes=1, stray_gpu=True, offline=(15,), disallowed=(0,))


def test_text_view_synthetic() -> None:
    check_golden("synthetic.txt", render_text(rich_topology(), width=120))


def test_text_view_dgx_a100() -> None:
    topo = load_topology(str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"))
    # the source names the path it was read from; keep the golden independent of the checkout
    topo = Topology(**{**topo.__dict__, "source": "nvidia-smi:dgx-a100-8numa-nps4-10nic.txt"})
    check_golden("dgx-a100-nps4.txt", render_text(topo, width=120))


def test_svg_small_with_plan() -> None:
    topo = make_topology(packages=2, cores_per_node=2, smt=2, gpus_per_node=1, nics_per_node=1, nv="NV4")
    plan: LaunchPlan = plan_for(topo)
    check_golden("small-plan.svg", render_svg(topo, plan))
