"""Layouts in-process: the spec parser and its one-line errors, the node boundary, the plan's record, the rank's
environment and visible devices, and the node order (Slurm's topology, c10d's keyed descriptors). Pure or one
process; the placement's optimum is tests/plan/test_plan_placement.py's."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
from layouts import crossed
from topo_helpers import FIXTURES

from numarun import envvars
from numarun.argtypes import NodeRange
from numarun.comm.context import job_layout
from numarun.errors import DistInitError, LayoutError
from numarun.jobenv.model import JobShape, Mode, Scheduler
from numarun.jobenv.settle import settle_node
from numarun.jobenv.slurm import node_order, parse_leaf_switches
from numarun.launch.spec import rendezvous_key
from numarun.launch.torchrun import worker_env
from numarun.layout import DIMS, Layout, mesh_groups, node_cut
from numarun.options.launch import Setting, Source, given
from numarun.plan.binding import make_plan
from numarun.plan.mesh import resolve_on_nodes
from numarun.plan.model import BindingMode, LaunchPlan, PlanRequest
from numarun.topology.discover import load_topology
from numarun.worker.bootstrap import apply_env, apply_mesh

PCIE8 = str(FIXTURES / "nvidia-smi" / "pcie-8gpu-pix-phb-sys-2x14c.txt")


# ---------------------------------------------------------------- the spec
@pytest.mark.parametrize(
    "text, says",
    [
        ("pq=2,tp=4", "unknown dimension 'pq'; expected names from pp, dp_replicate, dp_shard, cp, tp"),
        ("tp=2,tp=4", "tp is named twice"),
        ("dp_shard=-1,tp=-1", "-1 for both dp_shard and tp"),
        ("tp=0", "tp=0 is not a positive size"),
        ("tp=-2", "tp=-2 is not a positive size"),
        ("tp=two", "tp='two' is not an integer"),
        ("tp=2.5", "tp='2.5' is not an integer"),
        ("tp", "'tp' is not name=size"),
        ("", "empty"),
        ("tp=2,", "'' is not name=size"),
    ],
)
def test_bad_specs_are_one_line_naming_the_value_and_the_form(text: str, says: str) -> None:
    with pytest.raises(LayoutError) as e:
        Layout.parse(text, where="NUMARUN_MESH")
    msg = str(e.value)
    assert msg.startswith(f"bad NUMARUN_MESH {text!r}: ") and says in msg and "\n" not in msg
    assert "e.g. pp=2,dp_shard=-1,tp=4" in msg


def test_any_subset_in_any_order_with_size_one_dims() -> None:
    for names in (("tp",), ("cp", "pp"), ("tp", "dp_shard", "pp"), DIMS, DIMS[::-1]):
        spec = Layout.parse(",".join(f"{n}={1 if i % 2 else -1 if i == 0 else 2}" for i, n in enumerate(names)))
        assert spec.names == names
        layout = spec.resolved(8 * spec.known)
        assert layout.names == names and layout.world_size == 8 * spec.known
    assert Layout.parse(" pp = 2 , tp = 4 ").text == "pp=2,tp=4"


def test_the_product_and_the_rest_name_the_world_size() -> None:
    with pytest.raises(
        LayoutError,
        match=r"its sizes multiply to 6, but the job has 8 ranks \(2 nodes x 4 ranks\); "
        r"expected sizes whose product is 8",
    ):
        resolve_on_nodes(Layout.parse("tp=2,dp_shard=3"), nproc=4, nnodes=NodeRange.of(2))
    with pytest.raises(
        LayoutError, match=r"-1 for dp_shard is the job's 8 ranks divided by the other sizes' product 3"
    ):
        Layout.parse("dp_shard=-1,tp=3").resolved(8)
    with pytest.raises(LayoutError, match=r"is the job's 8 ranks \(2 nodes x 4 ranks\) divided by") as e:
        Layout.parse("dp_shard=-1,tp=3", where="NUMARUN_MESH").resolved(8, nodes=2)  # named once, where it is raised
    assert e.value.where == "NUMARUN_MESH" and e.value.page == "layouts.md"
    assert Layout.parse("pp=2,dp_shard=-1,tp=4").resolved(32).shape == (2, 4, 4)


def test_the_node_boundary() -> None:
    layout = Layout.parse("pp=2,dp_shard=4,tp=4").resolved(32)
    cut = node_cut(layout, 8)
    assert (cut.inner, cut.split, cut.split_inner, cut.outer) == (("tp",), "dp_shard", 2, ("pp",))
    cut = node_cut(layout, 16)
    assert (cut.inner, cut.split, cut.outer) == (("dp_shard", "tp"), None, ("pp",))
    assert node_cut(Layout.parse("dp_shard=2,pp=1,tp=8").resolved(16), 8).outer == ("dp_shard",)
    with pytest.raises(LayoutError, match=r"does not fit nodes of 4 ranks"):
        node_cut(Layout.parse("dp_shard=-1,tp=3").resolved(12), 4)
    with pytest.raises(LayoutError, match=r"does not fit nodes of 8 ranks"):
        node_cut(Layout.parse("dp_shard=3,tp=4").resolved(12), 8)  # dp_shard's groups of 3 cut 2 + 1
    assert node_cut(Layout.parse("dp_shard=-1,tp=4").resolved(8), 2).split == "tp"  # tp across two nodes, evenly


def test_elastic_node_counts_need_the_rest_outermost() -> None:
    layout, cut, nnodes = resolve_on_nodes(Layout.parse("dp_shard=-1,tp=4"), nproc=8, nnodes=NodeRange(1, 4))
    assert nnodes == 0 and cut.inner == ("tp",) and cut.split == "dp_shard"
    for bad in ("dp_shard=2,tp=4", "pp=2,dp_shard=-1,tp=4"):
        with pytest.raises(LayoutError, match=r"with --nnodes 1:4: the world size is known only once the nodes meet"):
            resolve_on_nodes(Layout.parse(bad), nproc=8, nnodes=NodeRange(1, 4))
    with pytest.raises(LayoutError, match=r"sizes inside -1 multiply to 3, which does not divide the 8 ranks per node"):
        resolve_on_nodes(Layout.parse("pp=1,dp_shard=-1,tp=3"), nproc=8, nnodes=NodeRange(1, 4))
    t = load_topology(PCIE8)
    plan = make_plan(t, PlanRequest(mesh=Layout.parse("dp_shard=-1,tp=2"), nnodes=NodeRange(1, 4)))
    assert plan.mesh.spec == "dp_shard=-1,tp=2" and plan.mesh.nnodes == 0
    assert {d.name: d.reach for d in plan.mesh.dims} == {"dp_shard": "split", "tp": "node"}


def test_groups_are_the_row_major_mesh() -> None:
    assert mesh_groups((2, 2, 2), 0) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert mesh_groups((2, 4), 1) == ((0, 1, 2, 3), (4, 5, 6, 7))


# ---------------------------------------------------------------- the plan and the rank's environment
def test_each_rank_drives_its_gpu_as_cuda_local_rank() -> None:
    t = crossed()
    plan = make_plan(t, PlanRequest(mesh=Layout.parse("dp_shard=2,tp=2")))
    assert [r.gpu.index for r in plan.ranks] == [0, 2, 1, 3] and plan.mesh.default_gpus == (0, 1, 2, 3)
    assert [r.gpu.cuda_index for r in plan.ranks] == [0, 1, 2, 3]
    uuids = [g.uuid for g in t.gpus]
    cvd = ",".join(uuids[i] for i in (0, 2, 1, 3))
    assert plan.mesh.cuda_visible_devices == cvd and {r.env["CUDA_VISIBLE_DEVICES"] for r in plan.ranks} == {cvd}
    # each rank's CPUs and memory follow its GPU: GPU 2 sits on NUMA node 1
    assert [r.numa_node for r in plan.ranks] == [0, 1, 0, 1]
    tp = next(d for d in plan.mesh.dims if d.name == "tp")
    assert tp.groups == ((0, 1), (2, 3)) and tp.links == ("NV4", "NV4") and tp.default_links == ("NODE", "NODE")
    # the user's own entries, reordered: indices stay indices
    plan = make_plan(t, PlanRequest(mesh=Layout.parse("dp_shard=2,tp=2"), cuda_visible_devices="3,2,1,0"))
    assert plan.mesh.cuda_visible_devices == "3,1,2,0" and [r.gpu.index for r in plan.ranks] == [3, 1, 2, 0]
    # without a layout, nothing changes
    plain = make_plan(t, PlanRequest())
    assert plain.mesh is None and all("CUDA_VISIBLE_DEVICES" not in r.env for r in plain.ranks)
    assert LaunchPlan.from_json(plan.to_json()) == plan


def test_the_reordered_visible_devices_are_applied_though_the_user_set_them() -> None:
    plan = make_plan(crossed(), PlanRequest(mesh=Layout.parse("dp_shard=2,tp=2"), cuda_visible_devices="0,1,2,3"))
    user = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "OMP_NUM_THREADS": "3"}
    env = worker_env(plan, given(), user, plan_path="p.json")
    assert env[envvars.USER_ENV] == "OMP_NUM_THREADS"  # CUDA_VISIBLE_DEVICES is derived from the user's, not kept
    rank = dict(user, **{envvars.USER_ENV: env[envvars.USER_ENV]})
    apply_env(plan.ranks[1], rank)
    assert (
        rank["CUDA_VISIBLE_DEVICES"] == plan.mesh.cuda_visible_devices != "0,1,2,3" and rank["OMP_NUM_THREADS"] == "3"
    )
    by_hand = dict(user)  # started by hand (no NUMARUN_USER_ENV): still the plan's order
    apply_env(plan.ranks[0], by_hand)
    assert by_hand["CUDA_VISIBLE_DEVICES"] == plan.mesh.cuda_visible_devices


def test_the_ranks_environment_names_the_layout() -> None:
    t = load_topology(PCIE8)
    plan = make_plan(
        t, PlanRequest(mesh=Layout.parse("pp=2,dp_shard=-1,tp=2"), nnodes=NodeRange.of(6), nproc_per_node=2)
    )
    env = {"WORLD_SIZE": "12"}
    apply_mesh(plan, env)
    assert env == {
        "WORLD_SIZE": "12",
        envvars.MESH: "pp=2,dp_shard=3,tp=2",
        envvars.MESH_NAMES: "pp,dp_shard,tp",
        envvars.MESH_SHAPE: "2,3,2",
        envvars.MESH_PP: "2",
        envvars.MESH_DP_REPLICATE: "1",
        envvars.MESH_DP_SHARD: "3",
        envvars.MESH_CP: "1",
        envvars.MESH_TP: "2",
    }
    elastic = make_plan(t, PlanRequest(mesh=Layout.parse("dp_shard=-1,tp=2"), nnodes=NodeRange(1, 3), nproc_per_node=4))
    env = {"WORLD_SIZE": "12"}  # the rest is known in the rank, from the world the rendezvous made
    apply_mesh(elastic, env)
    assert (env[envvars.MESH], env[envvars.MESH_DP_SHARD]) == ("dp_shard=6,tp=2", "6")
    assert Layout.parse("tp=8").resolved(8).env()[envvars.MESH_SHAPE] == "8"


def test_init_checks_the_layout_against_the_job() -> None:
    t = load_topology(PCIE8)
    declared = make_plan(
        t, PlanRequest(mesh=Layout.parse("dp_shard=-1,tp=2"), nnodes=NodeRange(1, 2), nproc_per_node=4)
    )
    assert declared.mesh is not None and declared.mesh.layout.shape == (-1, 2)  # the plan carries the layout
    assert job_layout(declared.mesh.layout, world_size=8, node_sizes=(4, 4)).shape == (4, 2)
    assert job_layout(None, world_size=8, node_sizes=(4, 4)) is None
    with pytest.raises(
        DistInitError,
        match=r"bad NUMARUN_PLAN layout 'dp_shard=-1,tp=2': nodes run 4,2 ranks; expected the "
        r"same number of ranks on every node",
    ):
        job_layout(declared.mesh.layout, world_size=6, node_sizes=(4, 2))
    with pytest.raises(LayoutError, match="does not fit nodes of 2 ranks"):
        job_layout(Layout.parse("dp_shard=-1,tp=3"), world_size=6, node_sizes=(2, 2, 2))


def test_a_layout_that_cannot_be_placed_well_runs_with_one_line() -> None:
    plan = make_plan(load_topology(PCIE8), PlanRequest(mesh=Layout.parse("dp_shard=2,tp=4")))
    lines = [w for w in plan.warnings if "slowest tp link" in w]
    assert lines == [
        "--mesh dp_shard=2,tp=4: the slowest tp link is PHB (no placement keeps tp's groups of 4 on this "
        "node's fastest links, PCIe switch); the job runs so"
    ]


def test_a_task_that_holds_its_own_gpu_keeps_it() -> None:
    plan = make_plan(crossed(), PlanRequest(mesh=Layout.parse("dp_shard=2,tp=2"), keep_gpus=True))
    assert [r.gpu.index for r in plan.ranks] == [0, 1, 2, 3] and plan.mesh.cuda_visible_devices == ""
    assert any("gives each task its own GPU" in w for w in plan.warnings)


# ---------------------------------------------------------------- the node order
TOPOLOGY = """SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[1,3]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=node[2,4]
SwitchName=s0 Level=1 LinkSpeed=1 Switches=s[1-2]
"""
BLOCKS = """BlockName=b2 BlockIndex=1 Nodes=gb[19-20] BlockSize=18
BlockName=b1 BlockIndex=0 Nodes=gb[01-02] BlockSize=18
"""


def test_leaf_switches_and_blocks_give_adjacent_node_ranks() -> None:
    nodes = ("node1", "node2", "node3", "node4")
    assert node_order(nodes, parse_leaf_switches(TOPOLOGY)) == ["node1", "node3", "node2", "node4"]
    gb = ("gb01", "gb19", "gb02", "gb20")
    assert node_order(gb, parse_leaf_switches(BLOCKS)) == ["gb01", "gb02", "gb19", "gb20"]


def _slurm_job(node: str) -> JobShape:
    nodes = ("node1", "node2", "node3", "node4")
    return JobShape(
        scheduler=Scheduler.SLURM,
        mode=Mode.PER_NODE,
        job="7.0",
        nnodes=4,
        node_index=nodes.index(node),
        nodes=nodes,
        node_name=node,
        rank=nodes.index(node),
        local_rank=0,
        world_size=4,
        local_world_size=1,
        job_id=7,
        step_id=0,
    )


def test_a_c10d_node_reports_its_place_in_slurms_switch_order() -> None:
    stated = {
        "rdzv_backend": Setting("c10d", Source.COMMAND_LINE, "--rdzv-backend"),
        "mesh": Setting("tp=1", Source.COMMAND_LINE, "--mesh"),
    }
    keys = {}
    for node in ("node1", "node2", "node3", "node4"):
        rdv = settle_node(_slurm_job(node), stated, leaf_switch=parse_leaf_switches(TOPOLOGY))
        assert rdv.own_rendezvous
        keys[node] = rendezvous_key(nvlink_domain="", position=rdv.order.index(node), environ={})
    assert sorted(keys, key=keys.__getitem__) == ["node1", "node3", "node2", "node4"]
    assert rendezvous_key(nvlink_domain="d/1", position=None, environ={envvars.NODE_KEY: " rack7 "}) == (
        "d/1",
        "rack7",
        "",
    )


def test_c10d_sorts_keyed_descriptors_and_other_nodes_unpickle_them() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    from numarun import torch_private

    keyed = torch_private.KeyedNodeDesc
    nodes = [
        keyed("10.0.0.1", 10, 0, ("", "", "000000002")),
        keyed("10.0.0.9", 5, 0, ("", "", "000000000")),
        keyed("10.0.0.5", 7, 0, ("", "", "000000001")),
    ]
    assert [n.addr for n in sorted(nodes)] == ["10.0.0.9", "10.0.0.5", "10.0.0.1"]  # not the address order
    state = dr._RendezvousState()
    for n in nodes:
        state.participants[n] = 0
    back = pickle.loads(pickle.dumps(state))
    assert [n.key for n in sorted(back.participants)] == [("", "", f"00000000{i}") for i in range(3)]
    assert dr._NodeDesc("a", 1, 0) < keyed("a", 0, 0, ("x",))  # a plain descriptor sorts as key ()
    try:
        assert torch_private.order_nodes(("d", "", "000000003"))
        made = dr.DynamicRendezvousHandler._node_desc_generator.generate("h")
        assert isinstance(made, keyed) and made.key == ("d", "", "000000003") and made.addr == "h"
    finally:
        torch_private.order_nodes(None)
    assert type(dr.DynamicRendezvousHandler._node_desc_generator.generate("h")) is dr._NodeDesc


def test_the_keyed_rendezvous_still_matches_torchs_shape() -> None:
    """What order_nodes relies on: descriptors sorted for ranks, made by the handler class's generator."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    assert [f.name for f in dataclasses.fields(dr._NodeDesc)] == ["addr", "pid", "local_id"]
    assert isinstance(dr.DynamicRendezvousHandler._node_desc_generator, dr._NodeDescGenerator)
    assert "sorted(state.participants)" in inspect.getsource(
        dr._DistributedRendezvousOpExecutor
    ) or "sorted(state.participants)" in inspect.getsource(dr)
    assert "cls._node_desc_generator.generate(local_addr)" in inspect.getsource(
        dr.DynamicRendezvousHandler.from_backend
    )


def test_the_plan_json_keeps_gpu_index() -> None:
    plan = make_plan(load_topology(PCIE8), PlanRequest(mesh=Layout.parse("tp=2,dp_shard=4")))
    data = json.loads(plan.to_json())
    assert [r["gpu"]["index"] for r in data["ranks"]] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert data["mesh"]["spec"] == "tp=2,dp_shard=4" and data["mesh"]["search"].startswith("exhaustive")
    assert BindingMode(data["binding"]) is BindingMode.EXCLUSIVE
