"""``--mesh`` from the command line, as users type it: ``numarun plan`` (table, --json, --svg), ``numarun run
--dry-run``, ``numarun submit --dry-run``, the variable and the config key, and every bad layout as one line and exit
code 2 before anything starts. Golden tables in tests/golden/plan/mesh-*.txt (regenerate with
NUMARUN_REGEN_GOLDEN=1)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from golden import GOLDEN_DIR, check_golden
from helpers import SCRIPTS, error_lines, run_numarun
from layouts import classes_of, crossed, optimum, with_links
from topo_helpers import FIXTURES, build_topology

pytestmark = pytest.mark.slow  # every test here starts processes

SMI = FIXTURES / "nvidia-smi"


def snapshot(tmp_path: Path) -> tuple[Path, object]:
    """A machine not in the fixtures: 6 GPUs, NVLink pairs 0-4, 1-5 and 2-3, switches 0-1 and 4-5, uneven sockets."""
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=(0, 0, 1, 1, 0, 0))
    t = with_links(t, ["0-4=NV2", "1-5=NV2", "2-3=NV4", "0-1=PIX", "4-5=PIX"])
    path = tmp_path / "six.json"
    path.write_text(t.to_json())
    return path, t


@pytest.mark.parametrize(
    "names, shape, cvd",
    [
        (("dp_shard", "tp"), (3, 2), None),
        (("tp", "dp_replicate"), (2, 3), None),
        (("cp", "pp", "tp"), (2, 1, 2), "5,2,0,3,1,4"),
        (("tp", "dp_shard"), (2, 2), "3,1,4,0,5,2"),
    ],
)
def test_plan_json_reaches_the_optimum_on_a_new_machine(tmp_path: Path, names, shape, cvd) -> None:
    path, t = snapshot(tmp_path)
    spec = ",".join(f"{n}={s}" for n, s in zip(names, shape))
    env = {"CUDA_VISIBLE_DEVICES": cvd} if cvd else {}
    proc = run_numarun(
        "plan",
        "--topology",
        str(path),
        "--nproc-per-node",
        str(math.prod(shape)),
        "--mesh",
        spec,
        "--binding",
        "node",
        "--json",
        **env,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    visible = [int(e) for e in cvd.split(",")] if cvd else list(range(6))
    got = tuple(visible.index(r["gpu"]["index"]) for r in plan["ranks"])
    cls, _ = classes_of(t, cvd)
    assert got == optimum(names, shape, cls)[1]
    assert [r["gpu"]["cuda_index"] for r in plan["ranks"]] == list(range(len(got)))
    order = plan["mesh"]["cuda_visible_devices"].split(",") if plan["mesh"]["cuda_visible_devices"] else []
    if order:  # every rank sees its own GPU as cuda:<local rank>, in the user's own terms
        assert [int(order[i]) for i in range(len(got))] == [r["gpu"]["index"] for r in plan["ranks"]]
        assert {r["env"]["CUDA_VISIBLE_DEVICES"] for r in plan["ranks"]} == {plan["mesh"]["cuda_visible_devices"]}


@pytest.mark.parametrize(
    "args, env, says",
    [
        (
            ["--mesh", "tq=4"],
            {},
            "bad --mesh 'tq=4': unknown dimension 'tq'; expected names from pp, dp_replicate, dp_shard, cp, tp",
        ),
        (["--mesh", "tp=2,tp=4"], {}, "bad --mesh 'tp=2,tp=4': tp is named twice"),
        (["--mesh", "tp=-1,dp_shard=-1"], {}, "bad --mesh 'tp=-1,dp_shard=-1': -1 for both tp and dp_shard"),
        (["--mesh", "tp=0,dp_shard=8"], {}, "bad --mesh 'tp=0,dp_shard=8': tp=0 is not a positive size"),
        (["--mesh", "tp=x"], {}, "bad --mesh 'tp=x': tp='x' is not an integer"),
        (
            ["--mesh", "tp=2,dp_shard=2"],
            {},
            "its sizes multiply to 4, but the job has 8 ranks; expected sizes whose product is 8",
        ),
        (
            ["--mesh", "tp=3,dp_shard=-1"],
            {},
            "-1 for dp_shard is the job's 8 ranks divided by the other sizes' product 3",
        ),
        (["--mesh", "pp=2,dp_shard=3,tp=4", "--nnodes", "3"], {}, "it does not fit nodes of 8 ranks"),
        (
            ["--mesh", "dp_shard=2,tp=4", "--nnodes", "1:4"],
            {},
            "with --nnodes 1:4: the world size is known only once the nodes meet",
        ),
        ([], {"NUMARUN_MESH": "pp=2,xx=4"}, "bad NUMARUN_MESH 'pp=2,xx=4': unknown dimension 'xx'"),
    ],
)
def test_bad_layouts_are_one_line_and_exit_2(args, env, says) -> None:
    proc = run_numarun("plan", "--topology", str(SMI / "pcie-8gpu-pix-phb-sys-2x14c.txt"), *args, **env)
    assert proc.returncode == 2, proc.stderr
    assert error_lines(proc.stderr) == proc.stderr.strip().splitlines() and len(error_lines(proc.stderr)) == 1
    assert says in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""


def test_run_refuses_a_bad_layout_before_any_rank_starts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_numarun("--nproc-per-node", "2", "--mesh", "tp=4", str(SCRIPTS / "mesh_ranks.py"), "--out", str(out))
    assert proc.returncode == 2 and error_lines(proc.stderr) == [
        "numarun: error: bad --mesh 'tp=4': its sizes multiply to 4, but the job has 2 ranks; expected sizes whose "
        "product is 2, or -1 for one dimension (the rest) (see https://numarun.github.io/numarun/layouts/)"
    ], proc.stderr
    assert not list(out.iterdir())
    proc = run_numarun(
        "submit",
        "--dry-run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "4",
        "--mesh",
        "dp_shard=3,tp=-1",
        str(SCRIPTS / "mesh_ranks.py"),
    )
    assert proc.returncode == 2 and "bad --mesh 'dp_shard=3,tp=-1': -1 for tp is the job's 8 ranks" in proc.stderr


def test_dry_run_shows_the_layout_and_every_source(tmp_path: Path) -> None:
    path = tmp_path / "crossed.json"
    path.write_text(crossed().to_json())
    proc = run_numarun(
        "--dry-run",
        "--topology",
        str(path),
        "--binding",
        "node",
        str(SCRIPTS / "mesh_ranks.py"),
        "--out",
        str(tmp_path),
        NUMARUN_MESH="dp_shard=-1,tp=2",
    )
    assert proc.returncode == 0, proc.stderr
    assert "layout dp_shard=2,tp=2 on 1 node (search: exhaustive" in proc.stdout
    assert "tp: 2 groups on NV4; default order: 2 groups through NODE" in proc.stdout
    assert "mesh             dp_shard=-1,tp=2 environment (NUMARUN_MESH)" in proc.stdout
    sub = run_numarun(
        "submit", "--dry-run", "--nnodes", "2", "--mesh", "dp_shard=-1,tp=2", str(SCRIPTS / "mesh_ranks.py")
    )
    assert sub.returncode == 0 and "--mesh=dp_shard=-1,tp=2" in sub.stdout, sub.stderr


def test_plan_svg_lists_each_dimension(tmp_path: Path) -> None:
    svg = tmp_path / "plan.svg"
    proc = run_numarun(
        "plan",
        "--topology",
        str(SMI / "pcie-8gpu-pix-phb-sys-2x14c.txt"),
        "--mesh",
        "dp_shard=4,tp=2",
        "--svg",
        str(svg),
        CUDA_VISIBLE_DEVICES="0,4,2,6,1,5,3,7",
    )
    assert proc.returncode == 0, proc.stderr
    text = svg.read_text()
    assert 'data-dim="tp"' in text and "4 groups behind PIX; default order: 4 groups across SYS" in text


GOLDEN_MESH = {
    # the default is wrong: a scheduler's order splits every PCIe switch pair across the sockets
    "mesh-pcie-8gpu-shuffled": (
        SMI / "pcie-8gpu-pix-phb-sys-2x14c.txt",
        ["--mesh", "dp_shard=4,tp=2"],
        {"CUDA_VISIBLE_DEVICES": "0,4,2,6,1,5,3,7"},
    ),
    # the default is right: every pair is NVLink (NVSwitch); two nodes, pipeline stages across them
    "mesh-p4d-two-nodes": (SMI / "aws-p4d.24xlarge.txt", ["--mesh", "pp=2,dp_shard=-1,tp=4", "--nnodes", "2"], {}),
    # uneven sockets: GPU0 alone on socket 1
    "mesh-5gpu-uneven": (
        SMI / "5gpu-dual-socket-mixed-numa.txt",
        ["--mesh", "dp_shard=2,tp=2", "--nproc-per-node", "4"],
        {},
    ),
}


@pytest.mark.parametrize("name", GOLDEN_MESH)
def test_golden_mesh_tables(name: str) -> None:
    source, args, env = GOLDEN_MESH[name]
    proc = run_numarun("plan", "--topology", str(source.relative_to(FIXTURES.parent.parent)), *args, **env)
    assert proc.returncode == 0, proc.stderr
    check_golden(GOLDEN_DIR / "plan" / f"{name}.txt", proc.stdout)


def test_random_new_machines_through_the_cli(tmp_path: Path) -> None:
    rng = random.Random(41)
    t = build_topology(nodes=2, cores_per_node=8, gpu_nodes=(0, 1, 0, 1, 0, 1, 0, 1))
    t = with_links(
        t,
        [
            f"{a}-{b}={rng.choice(['NV1', 'NV2', 'PXB', 'PHB'])}"
            for a in range(8)
            for b in range(a + 1, 8)
            if rng.random() < 0.3
        ],
    )
    path = tmp_path / "eight.json"
    path.write_text(t.to_json())
    cvd = ",".join(map(str, rng.sample(range(8), 8)))
    proc = run_numarun(
        "plan",
        "--topology",
        str(path),
        "--nproc-per-node",
        "4",
        "--mesh",
        "tp=2,cp=2",
        "--json",
        CUDA_VISIBLE_DEVICES=cvd,
    )
    assert proc.returncode == 0, proc.stderr
    visible = [int(e) for e in cvd.split(",")]
    got = tuple(visible.index(r["gpu"]["index"]) for r in json.loads(proc.stdout)["ranks"])
    assert got == optimum(("tp", "cp"), (2, 2), classes_of(t, cvd)[0])[1]
