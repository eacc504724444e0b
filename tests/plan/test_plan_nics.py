"""NCCL's NIC rules on every recorded multi-NIC GPU machine, and RDMA ports as read from the trees.

One ``NCCL_IB_HCA`` per node naming the compute NICs (NVIDIA/nccl#1478); storage NICs and
down ports out; the per-rank NIC (UCX/gloo) spread over the rails.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import FIXTURES
from topo_helpers import check_invariants, recorded_topologies
from trees import SYSFS_DIR, extract_tree

from numarun.plan.binding import make_plan
from numarun.plan.model import LaunchPlan, NicPolicy, PlanRequest
from numarun.plan.nic import compute_nics
from numarun.topology.hwloc_xml import read_hwloc_xml
from numarun.topology.model import RdmaPort, Topology, link_rank
from numarun.topology.sysfs import read_sysfs

_PXB = link_rank("PXB")


ALL = recorded_topologies()
MULTI_NIC_GPU = {k: t for k, t in ALL.items() if t.gpus and len(t.nics) >= 2}


def test_the_recorded_multi_nic_gpu_machines_are_there() -> None:
    assert len(MULTI_NIC_GPU) >= 9
    assert sum(1 for t in MULTI_NIC_GPU.values() if sum(n.rdma for n in t.nics) >= 8) >= 4


def _best(t: Topology, nic_pos: int) -> int:
    return min(link_rank(t.gpu_nic_link(g, nic_pos)) for g in range(len(t.gpus)))


def _hca(plan: LaunchPlan) -> str | None:
    values = {r.env.get("NCCL_IB_HCA") for r in plan.ranks}
    assert len(values) == 1, f"NCCL_IB_HCA differs between ranks: {values}"
    return values.pop()


def _check_node_rules(t: Topology, plan: LaunchPlan) -> None:
    check_invariants(t, plan)
    hca = _hca(plan)
    assert len({r.env.get("NCCL_SOCKET_IFNAME") for r in plan.ranks}) == 1
    rdma = [(i, n) for i, n in enumerate(t.nics) if n.rdma]
    named = set(hca[1:].split(",")) if hca else {n.name for _, n in rdma if n.port_up}
    for i, n in rdma:
        if not n.port_up:
            assert n.name not in named, f"{n.name}: down port named"
        elif _best(t, i) <= _PXB:
            assert n.name in named, f"{n.name}: compute NIC (PIX/PXB to a GPU) left out"
        elif any(_best(t, j) < _best(t, i) for j, _ in rdma):
            assert n.name not in named, f"{n.name}: a NIC farther than others named"
    # per-rank NIC: reused only once every equally close NIC is taken
    used: dict[str, int] = {}
    for r in plan.ranks:
        if r.nic is None:
            continue
        if r.nic in used:
            g = next(i for i, x in enumerate(t.gpus) if x.index == r.gpu.index)  # type: ignore[union-attr]
            mine = link_rank(t.gpu_nic_link(g, [n.name for n in t.nics].index(r.nic)))
            ties = {
                n.name
                for k, n in enumerate(t.nics)
                if n.port_up
                and link_rank(t.gpu_nic_link(g, k)) == mine
                and (n.numa_node == t.gpus[g].numa_node)
                == (t.nics[[x.name for x in t.nics].index(r.nic)].numa_node == t.gpus[g].numa_node)
            }
            assert ties <= set(used), f"rank {r.local_rank}: {r.nic} reused while {sorted(ties - set(used))} are free"
        used[r.nic] = used.get(r.nic, 0) + 1


@pytest.mark.parametrize("name", sorted(MULTI_NIC_GPU))
def test_one_nccl_list_per_node_compute_in_storage_out(name: str) -> None:
    t = MULTI_NIC_GPU[name]
    plan = make_plan(t, PlanRequest())
    _check_node_rules(t, plan)
    compute = compute_nics(t)
    if len(compute) >= len(plan.ranks):
        nics = [r.nic for r in plan.ranks]
        assert len(set(nics)) == len(nics), f"ranks share NICs {nics} with {len(compute)} rails"


@pytest.mark.parametrize("name", sorted(k for k, t in MULTI_NIC_GPU.items() if compute_nics(t)))
def test_a_down_port_is_left_out(name: str) -> None:
    """The recorded machine with its first compute NIC's port down."""
    t = MULTI_NIC_GPU[name]
    victim = compute_nics(t)[0]
    nics = tuple(
        dataclasses.replace(n, ports=(RdmaPort(number=1, state="DOWN", link_layer="InfiniBand"),))
        if n.name == victim.name
        else n
        for n in t.nics
    )
    down = dataclasses.replace(t, nics=nics)
    plan = make_plan(down, PlanRequest())
    _check_node_rules(down, plan)
    hca = _hca(plan)
    if len(compute_nics(t)) > 1:
        assert hca is not None and victim.name not in hca[1:].split(",")
    else:
        assert hca is None  # the only rail is down: nothing to name (NCCL falls back to sockets)
    assert victim.name not in {r.nic for r in plan.ranks}


def test_recorded_dgx_a100_lists_its_eight_rails() -> None:
    t = MULTI_NIC_GPU["smi/dgx-a100-8numa-nps4-10nic"]
    plan = make_plan(t, PlanRequest())
    assert _hca(plan) == "=" + ",".join(f"mlx5_{i}" for i in range(8))  # mlx5_8/9: SYS to every GPU
    assert [r.env["UCX_NET_DEVICES"] for r in plan.ranks] == [f"{r.nic}:1" for r in plan.ranks]
    per_rank = make_plan(t, PlanRequest(nic_policy=NicPolicy.PER_RANK))
    assert [r.env["NCCL_IB_HCA"] for r in per_rank.ranks] == [f"={r.nic}" for r in per_rank.ranks]
    assert len({r.nic for r in per_rank.ranks}) == 8


def test_all_sys_nics_need_no_choosing() -> None:
    t = MULTI_NIC_GPU["smi/a100-sxm4-80gb-8gpu-2numa-4nic"]
    plan = make_plan(t, PlanRequest())
    assert _hca(plan) is None  # every NIC equally far: NCCL's own choice is the same set
    assert len({r.nic for r in plan.ranks}) == 4


# --- RDMA ports in the topology ---


def test_sysfs_reads_port_state_link_layer_and_rate() -> None:
    t = ALL["sysfs/32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2"]
    mlx = next(n for n in t.nics if n.name == "mlx4_0")
    assert mlx.ports == (RdmaPort(number=1, state="ACTIVE", link_layer="InfiniBand", rate_gbps=56.0),)
    assert mlx.port_up and mlx.port == 1 and mlx.speed_mbps == 56000


@pytest.fixture(scope="module")
def port_down_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded 32em64t tree with mlx4_0's port 1 down (state and rate as the kernel shows them)."""
    src = extract_tree(SYSFS_DIR / "32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2")
    dst = tmp_path_factory.mktemp("nic") / "tree"
    shutil.copytree(src, dst, symlinks=True)
    port = (dst / "sys/class/infiniband/mlx4_0").resolve() / "ports" / "1"
    assert port.is_relative_to(dst.resolve())
    (port / "state").write_text("1: DOWN\n")
    (port / "rate").write_text("10 Gb/sec (4X SDR)\n")
    return dst


def test_sysfs_port_down_variant(port_down_tree: Path) -> None:
    t = read_sysfs(port_down_tree)
    mlx = next(n for n in t.nics if n.name == "mlx4_0")
    assert mlx.ports[0].state == "DOWN" and mlx.ports[0].active is False and not mlx.port_up
    # the snapshot keeps the port; a version-1 snapshot (no ports) still reads
    again = Topology.from_json(t.to_json())
    assert again == t and again.schema_version == 2
    old = json.loads(t.to_json())
    old["schema_version"] = 1
    for n in old["nics"]:
        del n["ports"]
    v1 = Topology.from_dict(old)
    assert v1.schema_version == 2 and all(n.ports == () for n in v1.nics)


def test_hwloc_port_state_numbers() -> None:
    t = ALL["hwloc/32em64t-2n8c2t-pci-wholeio"]
    mlx = next(n for n in t.nics if n.name == "mlx5_0")
    assert mlx.ports == (RdmaPort(number=1, state="ACTIVE"),)
    text = (FIXTURES / "hwloc" / "32em64t-2n8c2t-pci-wholeio.xml").read_text()
    down = read_hwloc_xml(text.replace('name="Port1State" value="4"', 'name="Port1State" value="1"'), "down.xml")
    assert not next(n for n in down.nics if n.name == "mlx5_0").port_up


def test_unknown_port_state_counts_as_up() -> None:
    assert RdmaPort(number=1).active is None
    t = ALL["hwloc/24em64t-2n6c2t-pci"]
    assert all(n.port_up for n in t.nics)


# --- the config key and the flag ---


def test_config_key_nic_policy_feeds_the_flag_and_is_checked() -> None:
    from numarun.cli import build_parser
    from numarun.config import compose as C
    from numarun.config.schema import check_values
    from numarun.errors import ConfigError
    from numarun.options.launch import config_keys, from_args

    cfg = C.compose(["launcher.nic_policy=per-rank"])
    assert "nic_policy" in dict(config_keys()) and cfg.launcher.nic_policy == "per-rank"
    options = from_args(build_parser(only="plan").parse_args(["plan"]), {}).with_config({"nic_policy": "per-rank"})
    assert options.nic_policy is NicPolicy.PER_RANK and options.setting("nic_policy").where == "launcher.nic_policy"
    with pytest.raises(ConfigError, match="launcher.nic_policy 'rail'"):
        check_values(C.compose(["launcher.nic_policy=rail"]))
