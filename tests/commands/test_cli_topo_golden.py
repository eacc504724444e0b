"""Golden outputs of ``numarun topo``: the text view and a small picture.

Regenerate after an intended change with::

    NUMARUN_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/commands/test_cli_topo_golden.py

and review the diff under ``tests/golden/topo/`` before committing it.
"""

from __future__ import annotations

import golden
from helpers import FIXTURES, GOLDEN
from topo_helpers import make_topology, plan_for

from numarun.plan.model import LaunchPlan
from numarun.topology.discover import load_topology
from numarun.topology.model import Topology
from numarun.view.svg import render_svg
from numarun.view.topo import render_text

GOLDEN = GOLDEN / "topo"


def check_golden(name: str, text: str) -> None:
    golden.check_golden(GOLDEN / name, text)


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


def test_svg_dgx_a100_with_plan() -> None:
    """A DGX-class machine: NVSwitch (all pairs NV12), 8 rails in NCCL_IB_HCA, two storage NICs."""
    from numarun.plan.binding import make_plan
    from numarun.plan.model import PlanRequest

    topo = load_topology(str(FIXTURES / "nvidia-smi" / "dgx-a100-8numa-nps4-10nic.txt"))
    topo = Topology(**{**topo.__dict__, "source": "nvidia-smi:dgx-a100-8numa-nps4-10nic.txt", "hostname": "dgx-a100"})
    check_golden("dgx-a100-plan.svg", render_svg(topo, make_plan(topo, PlanRequest())))


def test_svg_zen4_core_complex() -> None:
    """Zen 4 (2x EPYC 9654): 24 L3 boxes, one core-complex rank in each."""
    from numarun.plan.binding import make_plan
    from numarun.plan.model import BindingMode, PlanRequest
    from numarun.topology.hwloc_xml import read_hwloc_xml

    topo = read_hwloc_xml(
        (FIXTURES / "hwloc" / "AMD-19h-Zen4-2xEpyc-9654.xml").read_text(), "AMD-19h-Zen4-2xEpyc-9654.xml"
    )
    topo = Topology(**{**topo.__dict__, "hostname": "zen4-2x9654"})
    plan = make_plan(topo, PlanRequest(binding=BindingMode.CORE_COMPLEX, cuda_visible_devices="", nproc_per_node=24))
    check_golden("zen4-core-complex.svg", render_svg(topo, plan))
