"""The plan (numarun.plan.model) is the JSON contract the workers read: it round-trips exactly and names a
missing rank."""

import json

import pytest

from numarun.errors import PlanError
from numarun.plan.model import BindingMode, GpuRef, LaunchPlan, MemPolicy, RankBinding


def test_plan_json_contract():
    plan = LaunchPlan(
        ranks=(
            RankBinding(0, GpuRef(0, "0000:18:00.0", 0), (0, 1), (0,), "mlx5_0", {"OMP_NUM_THREADS": "1"}, numa_node=0),
            RankBinding(1, None, (2, 3), (), None, {"OMP_NUM_THREADS": "1"}, mem_policy=MemPolicy.NONE),
        ),
        binding=BindingMode.EXCLUSIVE,
    )
    d = json.loads(plan.to_json())
    r0 = d["ranks"][0]
    assert r0["local_rank"] == 0 and r0["gpu"]["pci_bus_id"] == "0000:18:00.0" and r0["gpu"]["numa_node"] == 0
    assert (
        r0["cpus"] == [0, 1] and r0["mems"] == [0] and r0["nic"] == "mlx5_0" and r0["env"] == {"OMP_NUM_THREADS": "1"}
    )
    assert d["ranks"][1]["gpu"] is None
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert plan.rank(1).cpus == (2, 3)
    with pytest.raises(PlanError):
        plan.rank(5)
    with pytest.raises(PlanError):
        LaunchPlan.from_json('{"ranks": []}', "p.json")
