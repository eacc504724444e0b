"""numarun inside the user's own sbatch script, on the real, confining Slurm test cluster.

The ways users start jobs that numarun does not start itself: ``srun numarun`` (one task per
node), ``srun --ntasks-per-node=G numarun`` (one task per rank, with and without a GPU per
task), the batch shell's early ``$SLURM_NODEID`` expansion, ``mpirun`` inside an allocation, and
the job start of ``numarun submit`` counted in controller calls. Skipped without the cluster
(scripts/test-cluster.sh up, as root); every wait is bounded.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS, cluster_env, free_port, slurm, wait_until

from numarun.jobenv.slurm import node_order, parse_leaf_switches

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NUMARUN = str(Path(sys.executable).parent / "numarun")
RANKS = str(SCRIPTS / "slurm_ranks.py")


@pytest.fixture(scope="module")
def cluster():
    return cluster_env()


def batch(cluster, tmp_path: Path, body: str, *sbatch: str, timeout: float = 240) -> tuple[int, str]:
    """Run a batch script of the user's (``body``) to its end; (sbatch --wait's exit code, the job's output)."""
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\ncd {shlex.quote(str(REPO))}\n" + body
    )  # no GLOO_SOCKET_IFNAME: the address rule picks it
    log = tmp_path / "job.out"
    # not 'sbatch --wait': it polls with a back-off that adds up to half a minute to a short job
    job = slurm(cluster, "sbatch", "--parsable", "--time", "5", "-o", str(log), *sbatch, str(script)).stdout.strip()
    fields = wait_until(f"job {job} to end", lambda: _ended(cluster, job), timeout, 0.5)
    code = int(fields.get("ExitCode", "1:0").split(":")[0])
    return code, log.read_text() if log.exists() else ""


def _ended(cluster, job: str) -> dict[str, str] | None:
    text = slurm(cluster, "scontrol", "show", "job", job, check=False).stdout
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    return (
        fields
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        else None
    )


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def check_own_cpus(got: list[dict]) -> None:
    """Every rank runs on exactly its plan's CPUs, inside what Slurm gave the step, none shared on a node."""
    by_node: dict[str, list[dict]] = {}
    for r in got:
        assert r["affinity"] == r["plan_cpus"], r
        assert set(r["affinity"]) <= set(r["cgroup_cpus"]), r
        by_node.setdefault(r["node"], []).append(r)
    for node, ranks in by_node.items():
        seen: set[int] = set()
        for r in ranks:
            assert not seen & set(r["affinity"]), f"two ranks share a CPU on {node}"
            seen |= set(r["affinity"])


def test_srun_numarun_in_the_users_sbatch_is_one_world_in_slurms_order(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    body = (
        f"srun {NUMARUN} --nproc-per-node 2 {RANKS} --out {out}\n"
        # the doctor under srun on every node finds its nodes the same way
        f'srun {NUMARUN} doctor --no-measure; echo "doctor exit $?"\n'
    )
    rc, log = batch(cluster, tmp_path, body, "-N2", "--exclusive")
    assert rc == 0, log
    got = reports(out)
    assert sorted(r["rank"] for r in got) == [0, 1, 2, 3], log
    assert {r["world_size"] for r in got} == {4} and {r["all_reduce_sum"] for r in got} == {6.0}
    nodes = slurm(cluster, "scontrol", "show", "hostnames", got[0]["slurm_nodelist"]).stdout.split()
    order = node_order(nodes, parse_leaf_switches(slurm(cluster, "scontrol", "show", "topology").stdout))
    for r in got:
        assert r["rank"] == order.index(r["node"]) * 2 + r["local_rank"], r
    check_own_cpus(got)
    assert "per-node mode" in log and "node order" in log
    assert "numarun doctor: node rank 1: reported to node 0" in log and "doctor exit" in log, log
    assert re.search(r"\bnodes\b", log) and "link GB/s" in log, log  # node 0's report of both nodes


def test_one_task_per_rank_is_one_world_with_rank_equal_procid(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rc, log = batch(
        cluster, tmp_path, f"srun --ntasks-per-node=2 {NUMARUN} {RANKS} --out {out}\n", "-N2", "--ntasks-per-node=2"
    )
    assert rc == 0, log
    got = reports(out)
    assert [r["rank"] for r in got] == [r["slurm_procid"] for r in got] == [0, 1, 2, 3], log
    assert {r["world_size"] for r in got} == {4} and {r["all_reduce_sum"] for r in got} == {6.0}
    assert all(r["local_rank"] == r["slurm_localid"] and r["group_rank"] == r["slurm_nodeid"] for r in got)
    assert not any(r["torch_loaded_before_script"] for r in got)
    check_own_cpus(got)
    assert log.count("per-rank mode") == 4


def test_early_expanded_node_rank_ends_the_whole_job_in_seconds(cluster, tmp_path):
    body = (
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        'addr=$(scontrol show node "$head" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
        "t0=$(date +%s%N)\n"
        # the common mistake: $SLURM_NODEID expanded here, by the batch shell, to 0 for every node
        f"srun {NUMARUN} --nnodes 2 --node-rank $SLURM_NODEID --master-addr $addr --master-port 29533 "
        f"--nproc-per-node 1 {RANKS} --out {tmp_path}\n"
        'rc=$?; echo "srun exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms"\n'
        # a contradiction every node sees, and the opt-out that keeps today's behaviour
        f'srun {NUMARUN} --nnodes 3 {RANKS} --out {tmp_path}; echo "nnodes exit $?"\n'
    )
    rc, log = batch(cluster, tmp_path, body, "-N2")
    m = re.search(r"srun exit (\d+) after (\d+) ms", log)
    assert m and m.group(1) == "2" and int(m.group(2)) < 30_000, log
    refused = [line for line in log.splitlines() if line.startswith("numarun: error: bad --node-rank 0")]
    assert len(refused) == 1 and "SLURM_NODEID 1" in refused[0] and "expanded by the batch shell" in refused[0], log
    node = re.search(r"this task runs on (\S+) ", refused[0]).group(1)
    assert f"numarun: error: node {node} (SLURM_NODEID 1) refused to start" in log, log
    assert "nnodes exit 2" in log and log.count("bad --nnodes '3'") == 2, log
    assert not reports(tmp_path)


def test_c10d_with_a_layout_gives_node_ranks_by_switch_not_by_address(cluster, tmp_path):
    """The user's own c10d rendezvous on node1..node4: each node reports its place in Slurm's order regrouped by leaf
    switch (s1: node1,node3; s2: node2,node4), so node ranks follow the switches; c10d alone would sort the nodes by
    their addresses, which sort the other way (node4, node3, node2, node1)."""
    if len(cluster["NUMARUN_CLUSTER_NODES"].split()) < 4:
        pytest.fail("this test needs 'scripts/test-cluster.sh up --nodes 4'")
    out = tmp_path / "out"
    out.mkdir()
    body = (
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        'addr=$(scontrol show node "$head" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
        f"srun {NUMARUN} --rdzv-backend c10d --rdzv-endpoint $addr:{free_port()} --rdzv-id mesh --nproc-per-node 1 "
        f"--mesh dp_replicate=2,dp_shard=2 {SCRIPTS / 'mesh_ranks.py'} --out {out}\n"
    )
    rc, log = batch(cluster, tmp_path, body, "-N4")
    assert rc == 0, log
    got = {r["rank"]: r for r in reports(out)}
    assert {rank: r["host"] for rank, r in got.items()} == {0: "node1", 1: "node3", 2: "node2", 3: "node4"}, log
    assert {tuple(r["groups"]["dp_shard"]) for r in got.values()} == {(0, 1), (2, 3)}
    assert log.count("node order key") == 4, log


def test_no_detect_keeps_separate_worlds(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    body = f"srun {NUMARUN} --no-detect --nproc-per-node 1 {RANKS} --out {out}\n"
    rc, log = batch(cluster, tmp_path, body, "-N2")
    assert rc == 0, log
    got = reports(out)  # two one-rank worlds: both are rank 0 (one report survives)
    assert [r["world_size"] for r in got] == [1] and "per-node mode" not in log


def test_a_gpu_per_task_binds_each_rank_to_the_gpu_slurm_gave_it(cluster, tmp_path):
    """Slurm gives each task its own GPU (device cgroup) while every task reads CUDA_VISIBLE_DEVICES=0;
    the GPU tree's minor numbers run against the PCI order, as a driver may number them."""
    tree = cluster["NUMARUN_CLUSTER_GPU_TREE"]
    bus_of_minor = {0: "0000:86:00.0", 1: "0000:3b:00.0"}  # tests/fixtures/constructed/make_2gpu_minors_tree.py
    cpu_of_bus = {"0000:3b:00.0": [0], "0000:86:00.0": [1]}  # each GPU's NUMA node holds one CPU
    for bind in ("--cpu-bind=none", ""):
        out = tmp_path / f"out{bool(bind)}"
        out.mkdir()
        body = (
            f"export NUMARUN_TOPOLOGY={tree}\n"
            f"srun --ntasks-per-node=2 --gpus-per-task=1 {bind} {NUMARUN} --mem-policy none {RANKS} --out {out}\n"
        )
        rc, log = batch(
            cluster,
            tmp_path,
            body,
            "-N2",
            "-p",
            cluster["NUMARUN_CLUSTER_GPU_PARTITION"],
            "--ntasks-per-node=2",
            "--gpus-per-node=2",
        )
        assert rc == 0, log
        got = reports(out)
        assert [r["rank"] for r in got] == [0, 1, 2, 3], log
        for r in got:
            (minor,) = r["openable_gpu_minors"]
            assert r["cuda_visible_devices"] == "0" and r["gpu_cuda_index"] == 0, r
            assert r["gpu_bus_id"] == bus_of_minor[minor], r
            if bind:  # unbound tasks: each rank on its GPU's NUMA node
                assert r["affinity"] == cpu_of_bus[r["gpu_bus_id"]], r
            else:  # Slurm bound each task to a core itself: never widened
                assert len(r["affinity"]) == 1, r
        assert {r["gpu_bus_id"] for r in got if r["node"] == got[0]["node"]} == set(bus_of_minor.values())


def test_mpirun_inside_an_allocation_spans_two_nodes(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ifname = cluster["NUMARUN_CLUSTER_IFNAME"]
    body = (
        "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        'addr=$(scontrol show node "$head" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
        f"mpirun.openmpi --mca btl_tcp_if_include {ifname} --mca oob_tcp_if_include {ifname} -x MASTER_ADDR=$addr "
        f"{NUMARUN} {RANKS} --out {out}\n"
    )
    rc, log = batch(cluster, tmp_path, body, "-N2", "--ntasks-per-node=1")
    assert rc == 0, log
    got = reports(out)
    assert [r["rank"] for r in got] == [r["mpi_rank"] for r in got] == [0, 1], log
    assert {r["world_size"] for r in got} == {2} and len({r["node"] for r in got}) == 2
    assert "Open MPI job" in log and log.count("per-rank mode") == 2


SCONTROL_COUNTER = """#!/bin/bash
# counts this job's controller calls, then hands over to the real scontrol
echo "$(date +%s.%N) $*" >> {log}
exec {real} "$@"
"""


def test_a_submitted_job_asks_slurm_twice_at_start_whatever_its_size(cluster, tmp_path):
    real = slurm(cluster, "bash", "-c", "command -v scontrol").stdout.strip()
    wrap = tmp_path / "bin"
    wrap.mkdir()
    calls = tmp_path / "calls"
    (wrap / "scontrol").write_text(SCONTROL_COUNTER.format(log=shlex.quote(str(calls)), real=real))
    (wrap / "scontrol").chmod(0o755)
    nodes = len(cluster["NUMARUN_CLUSTER_NODES"].split())
    env = dict(cluster, PATH=f"{wrap}:{cluster['PATH']}")
    cmd = shlex.split(cluster["NUMARUN_CLUSTER_EXEC"]) + [
        NUMARUN,
        "submit",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        "1",
        "--time",
        "5",
        "--output-dir",
        str(tmp_path),
        "--env",
        f"GLOO_SOCKET_IFNAME={cluster['NUMARUN_CLUSTER_IFNAME']}",
        "--env",
        f"PATH={wrap}:{cluster['PATH']}",
        "--poll-seconds",
        "0.5",
        "--wait",
        RANKS,
    ]
    import subprocess

    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(
        next(line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("run dir:"))
    )
    assert len(reports(run_dir)) == nodes
    # the job's own calls (submit --wait's polling of 'show job' runs on the submit host, outside the job)
    in_job = [line.split(" ", 1)[1] for line in calls.read_text().splitlines() if " show job" not in line]
    assert sorted(c.split()[0] + " " + c.split()[1] for c in in_job) == ["-o show", "show topology"], in_job
