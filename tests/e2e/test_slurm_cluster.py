"""`numarun submit` on a real two-node Slurm cluster (scripts/test-cluster.sh up, as root).

Skipped unless NUMARUN_TEST_CLUSTER names the env file that 'test-cluster.sh up' writes.
Each job is 2 nodes x 1-2 gloo ranks and ends within seconds; every wait is bounded.
"""

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import RECORDING_SAMPLER, REPO, SCRIPTS, cluster_env, slurm, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


NUMARUN = [str(Path(sys.executable).parent / "numarun")]


@pytest.fixture(scope="module")
def cluster():
    return cluster_env()


def submit(cluster, out: Path, *args, wait=True, timeout=300) -> subprocess.CompletedProcess:
    argv = [
        *NUMARUN,
        "submit",
        "--nnodes",
        "2",
        "--time",
        "5",
        "--output-dir",
        str(out),
        "--poll-seconds",
        "0.5",  # no GLOO_SOCKET_IFNAME: numarun's address rule picks the nodes' interface
        *(["--wait"] if wait else []),
        *args,
    ]
    return slurm(cluster, *argv, timeout=timeout, check=False)


def printed(stdout: str, label: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in stdout.splitlines() if line.startswith(label + ":")]


def job_fields(cluster, job_id: str) -> dict[str, str]:
    text = slurm(cluster, "scontrol", "show", "job", job_id).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def test_two_nodes_two_ranks_each_bound(cluster, tmp_path):
    """A default job (no resource options): whole nodes, every rank on its own CPUs, ranks in Slurm's node order."""
    proc = submit(cluster, tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "slurm_ranks.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    (run_dir,) = printed(proc.stdout, "run dir")
    (log,) = printed(proc.stdout, "log")
    assert run_dir == f"{tmp_path}/{job_id}" and log == f"{tmp_path}/slurm-{job_id}.out"
    assert "step finished with exit code 0" in Path(log).read_text()
    assert f"job {job_id}: COMPLETED exit code 0:0" in proc.stdout
    reports = [json.loads(p.read_text()) for p in sorted(Path(run_dir).glob("rank-*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {r["world_size"] for r in reports} == {4} and {r["all_reduce_sum"] for r in reports} == {6.0}
    by_node: dict[str, list[dict]] = {}
    for r in reports:
        by_node.setdefault(r["node"], []).append(r)
        # the worker ran with exactly the CPUs its node's plan gave it
        assert r["plan_cpus"] is not None and r["affinity"] == r["plan_cpus"], r
        assert r["omp_num_threads"] == str(len(r["plan_cpus"]))
    assert len(by_node) == 2 and set(by_node) <= set(cluster["NUMARUN_CLUSTER_NODES"].split())
    for node, ranks in by_node.items():
        assert sorted(r["local_rank"] for r in ranks) == [0, 1]
        assert len({r["group_rank"] for r in ranks}) == 1
        # exclusive binding: the node's two ranks share no CPU
        assert not set(ranks[0]["affinity"]) & set(ranks[1]["affinity"]), node
        # whole node: the step's cgroup holds every CPU of the node, and the plan stayed inside it
        for r in ranks:
            assert len(r["cgroup_cpus"]) == int(cluster["NUMARUN_CLUSTER_CPUS_PER_NODE"]), r
            assert set(r["affinity"]) <= set(r["cgroup_cpus"]), r
    # ranks follow Slurm's node order, although the nodes' addresses sort the other way
    for r in reports:
        assert r["rank"] == r["slurm_nodeid"] * r["nproc_per_node"] + r["local_rank"], r
    fields = job_fields(cluster, job_id)
    assert fields["OverSubscribe"] == "NO", fields  # --exclusive
    nodes = slurm(cluster, "scontrol", "show", "hostnames", fields["NodeList"]).stdout.split()
    addr = dict(zip(cluster["NUMARUN_CLUSTER_NODES"].split(), cluster["NUMARUN_CLUSTER_ADDRS"].split()))
    assert sorted(nodes, key=addr.__getitem__) == nodes[::-1], "the test needs addresses sorting against the node order"
    assert (
        "Requested: 2 whole nodes (--exclusive): every CPU, no GPUs" in (tmp_path / f"sbatch-{job_id}.sh").read_text()
    )


def test_four_nodes_under_two_switches_get_adjacent_node_ranks(cluster, tmp_path):
    """topology/tree: s1 holds node1 and node3, s2 node2 and node4 (names interleave)."""
    nodes = cluster["NUMARUN_CLUSTER_NODES"].split()
    if len(nodes) < 4:
        pytest.fail("this test needs 'scripts/test-cluster.sh up --nodes 4'")
    proc = submit(cluster, tmp_path, "--nnodes", "4", "--nproc-per-node", "1", str(SCRIPTS / "slurm_ranks.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = printed(proc.stdout, "run dir")
    reports = [json.loads(p.read_text()) for p in sorted(Path(run_dir).glob("rank-*.json"))]
    by_rank = {r["rank"]: r["node"] for r in reports}
    assert by_rank == {0: "node1", 1: "node3", 2: "node2", 3: "node4"}, by_rank
    assert {r["world_size"] for r in reports} == {4} and {r["all_reduce_sum"] for r in reports} == {6.0}


def test_a_layout_over_four_nodes_keeps_each_dp_shard_group_under_one_switch(cluster, tmp_path):
    """--mesh dp_replicate=2,dp_shard=2 on node1..node4 (switches s1: node1,node3; s2: node2,node4): dp_shard's groups
    are node ranks 0,1 and 2,3, each under one switch; dp_replicate's cross the switches."""
    nodes = cluster["NUMARUN_CLUSTER_NODES"].split()
    if len(nodes) < 4:
        pytest.fail("this test needs 'scripts/test-cluster.sh up --nodes 4'")
    proc = submit(
        cluster,
        tmp_path,
        "--nnodes",
        "4",
        "--nproc-per-node",
        "1",
        "--mesh",
        "dp_replicate=2,dp_shard=2",
        str(SCRIPTS / "mesh_ranks.py"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = printed(proc.stdout, "run dir")
    reports = {r["rank"]: r for r in (json.loads(p.read_text()) for p in Path(run_dir).glob("rank-*.json"))}
    assert {rank: r["host"] for rank, r in reports.items()} == {0: "node1", 1: "node3", 2: "node2", 3: "node4"}
    for r in reports.values():
        assert r["names"] == ["dp_replicate", "dp_shard"] and r["env"]["NUMARUN_MESH"] == "dp_replicate=2,dp_shard=2"
        shard = {reports[k]["host"] for k in r["groups"]["dp_shard"]}
        assert shard in ({"node1", "node3"}, {"node2", "node4"}), r["groups"]
        assert r["sums"]["dp_shard"] == float(sum(r["groups"]["dp_shard"]))


def test_partial_node_job_gets_that_part_and_plans_inside_it(cluster, tmp_path):
    proc = submit(cluster, tmp_path, "--nproc-per-node", "1", "--cpus-per-task", "1", str(SCRIPTS / "slurm_ranks.py"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    (run_dir,) = printed(proc.stdout, "run dir")
    fields = job_fields(cluster, job_id)
    assert fields["OverSubscribe"] != "NO" and fields["NumCPUs"] == "2", fields
    reports = [json.loads(p.read_text()) for p in sorted(Path(run_dir).glob("rank-*.json"))]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for r in reports:
        # one CPU per node: Slurm's cgroup holds one, and the rank runs on exactly it
        assert len(r["cgroup_cpus"]) == 1 and r["affinity"] == r["cgroup_cpus"] == r["plan_cpus"], r
        assert r["rank"] == r["slurm_nodeid"], r


PLAN_ROW = re.compile(r"^\s+(\d+)\s+(\d+) \(cuda:(\d+)\)", re.M)


def test_gpu_gres_job_plans_on_the_gpus_slurm_gave(cluster, tmp_path):
    """Slurm allocates fake GPUs (device files); a --dry-run inside the job plans on exactly those.

    The GPU tree's minor numbers run against the PCI order: Slurm's GPU 1 is /dev/nvidia1, the GPU
    at 0000:3b:00.0, which is GPU 0 in PCI order (taking Slurm's index as the PCI position picks
    the other GPU, on the other NUMA node)."""
    part = cluster["NUMARUN_CLUSTER_GPU_PARTITION"]
    node = slurm(cluster, "sinfo", "-h", "-N", "-p", part, "-o", "%N").stdout.split()[0]
    # hold one GPU of the node so that the job gets the other one
    holder = slurm(
        cluster,
        "sbatch",
        "--parsable",
        "-p",
        part,
        "-w",
        node,
        "--gpus-per-node=1",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 120",
    ).stdout.strip()
    try:
        wait_until("the holder job to run", lambda: job_fields(cluster, holder).get("JobState") == "RUNNING", 60)
        tree = cluster["NUMARUN_CLUSTER_GPU_TREE"]
        proc = submit(
            cluster,
            tmp_path,
            "--nnodes",
            "1",
            "--partition",
            part,
            f"--sbatch-option=--nodelist={node}",
            "--gpus-per-node",
            "1",
            "--launch-opt=--dry-run",
            f"--launch-opt=--topology={tree}",
            str(SCRIPTS / "slurm_ranks.py"),
        )
    finally:
        slurm(cluster, "scancel", holder, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = Path(printed(proc.stdout, "log")[0]).read_text()
    visible, step = re.search(r"CUDA_VISIBLE_DEVICES=(\S+) SLURM_STEP_GPUS=(\S+)", log).groups()
    # ConstrainDevices: CUDA sees one device, cuda:0, which is the node's GPU the holder left
    assert visible == "0" and step == "1", log
    rows = PLAN_ROW.findall(log)
    assert [(gpu, cuda) for _, gpu, cuda in rows] == [("0", "0")], log
    assert "0000:3b:00.0" in log, log


def test_failing_rank_fails_the_job_with_its_exit_code(cluster, tmp_path):
    proc = submit(
        cluster,
        tmp_path,
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "slurm_ranks.py"),
        "--fail-rank",
        "3",
        "--exit-code",
        "3",
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    fields = job_fields(cluster, job_id)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "3:0"
    (log,) = printed(proc.stdout, "log")
    assert "step finished with exit code 3" in Path(log).read_text()


def _progress(run_dir: Path) -> list[tuple[int, int]]:
    try:
        lines = (run_dir / "progress.txt").read_text().split("\n")
    except FileNotFoundError:
        return []
    return [tuple(map(int, line.split())) for line in lines if line.count(" ") == 1]


def _start_requeued_now(cluster, job_id: str) -> None:
    # A requeued job waits ~2 min (BeginTime) before it may start again; the test skips that
    # wait once the previous run is gone. slurmd revokes the old run's credential with
    # one-second resolution, so a start within the same second would be refused.
    wait_until("the job back in the queue", lambda: job_fields(cluster, job_id).get("JobState") == "PENDING", 120)
    wait_until("the previous batch shell to end", lambda: _batch_shell_pid(job_id) is None, 60)
    ended = int(time.time())  # the revocation's second is this one or the next
    wait_until("a second clear of the revocation", lambda: int(time.time()) >= ended + 2, 5, 0.05)
    slurm(cluster, "scontrol", "update", f"JobId={job_id}", "StartTime=now")


def _batch_shell_pid(job_id: str) -> int | None:
    """The pid of the job's batch shell (slurmd runs <spool>/jobNNNNN/slurm_script)."""
    out = subprocess.run(["pgrep", "-f", f"/job{int(job_id):05d}/slurm_script"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if len(pids) == 1 else None


# The two scenarios below take two of the cluster's four nodes each and run at once: most of
# their time is waiting (steps that sleep, a 36 s save, Slurm's requeue), not work.


@pytest.fixture(scope="module")
def preempted(cluster, tmp_path_factory):
    pool = ThreadPoolExecutor(2)
    runs = {
        "requeued twice": pool.submit(_requeued_twice, cluster, tmp_path_factory.mktemp("requeue")),
        "slow save": pool.submit(_slow_save_after_the_signal, cluster, tmp_path_factory.mktemp("grace")),
    }
    yield runs
    pool.shutdown(wait=True)


REQUEUE_STEPS = 36


def _requeued_twice(cluster, tmp_path: Path) -> tuple[str, Path, str]:
    """(job id, run dir, log) of a counter job requeued by the admin, then by its own pre-timeout signal."""
    proc = submit(
        cluster,
        tmp_path,
        "--nproc-per-node",
        "1",
        "--requeue-limit",
        "3",
        str(SCRIPTS / "slurm_counter.py"),
        str(REQUEUE_STEPS),
        "0.3",
        wait=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    run_dir = Path(printed(proc.stdout, "run dir")[0])
    try:
        # 1. the admin (or a preemption) requeues the running job: Slurm sends TERM
        wait_until("5 steps", lambda: len(_progress(run_dir)) >= 5)
        slurm(cluster, "scontrol", "requeue", job_id)
        _start_requeued_now(cluster, job_id)
        # 2. the time limit nears: Slurm's --signal=B:USR1 reaches the batch shell only; the
        #    script stops the ranks (they checkpoint) and requeues the job itself
        wait_until("3 steps after the restart", lambda: sum(1 for _, r in _progress(run_dir) if r == 1) >= 3)
        pid = wait_until("the batch shell", lambda: _batch_shell_pid(job_id), 60)
        os.kill(pid, 10)  # SIGUSR1
        _start_requeued_now(cluster, job_id)
        wait_until(
            "the job to end", lambda: not slurm(cluster, "squeue", "-h", "-j", job_id, check=False).stdout.strip(), 180
        )
    finally:
        slurm(cluster, "scancel", job_id, check=False)
    return job_id, run_dir, Path(printed(proc.stdout, "log")[0]).read_text()


def test_requeue_resumes_from_checkpoint_without_losing_or_repeating_steps(cluster, preempted):
    job_id, run_dir, log = preempted["requeued twice"].result()
    fields = job_fields(cluster, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "2", fields
    history = json.loads((run_dir / "counter.json").read_text())["history"]
    assert [s for s, _ in history] == list(range(REQUEUE_STEPS)), "a step was lost or repeated"
    restarts = [r for _, r in history]
    assert restarts == sorted(restarts) and set(restarts) == {0, 1, 2}
    assert "requeueing job" in log and log.count(f"numarun: job {job_id} (restart") == 3


GRACE_STEPS, SAVE_S = 14, 36


def _slow_save_after_the_signal(cluster, tmp_path: Path) -> tuple[str, Path]:
    """(job id, run dir) of a counter job whose save after the pre-timeout signal takes 36 s."""
    proc = submit(
        cluster,
        tmp_path,
        "--nproc-per-node",
        "1",
        "--signal-before",
        "120",
        str(SCRIPTS / "slurm_counter.py"),
        str(GRACE_STEPS),
        "0.3",
        str(SAVE_S),
        wait=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    run_dir = Path(printed(proc.stdout, "run dir")[0])
    assert "--shutdown-timeout 105" in (tmp_path / f"sbatch-{job_id}.sh").read_text()
    try:
        wait_until("5 steps", lambda: len(_progress(run_dir)) >= 5)
        pid = wait_until("the batch shell", lambda: _batch_shell_pid(job_id), 60)
        os.kill(pid, 10)  # SIGUSR1, as Slurm sends it --signal-before seconds before the limit
        _start_requeued_now(cluster, job_id)
        wait_until(
            "the job to end", lambda: not slurm(cluster, "squeue", "-h", "-j", job_id, check=False).stdout.strip(), 240
        )
    finally:
        slurm(cluster, "scancel", job_id, check=False)
    return job_id, run_dir


def test_preemption_grace_follows_signal_before_and_the_slow_save_completes(cluster, preempted):
    """torchrun's agent kills ranks 30 s after TERM by default; with --signal-before 120 a 36 s
    save after the pre-timeout signal completes, the job requeues and resumes at that step."""
    job_id, run_dir = preempted["slow save"].result()
    text = (run_dir / "progress.txt").read_text()
    started = [int(line.split()[2]) for line in text.splitlines() if line.startswith("save start")]
    done = [int(line.split()[2]) for line in text.splitlines() if line.startswith("save done")]
    assert started and done == started, text  # the slow save was not killed midway
    fields = job_fields(cluster, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", fields
    history = json.loads((run_dir / "counter.json").read_text())["history"]
    assert [s for s, _ in history] == list(range(GRACE_STEPS)), "a step was lost or repeated"
    # the restarted run began exactly at the step the save recorded
    assert [s for s, r in history if r == 1][0] == done[0]


def _metric_steps(run_dir: Path) -> list[int]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass  # a line being written
    return steps


def test_trainer_requeued_mid_run_resumes_from_its_checkpoint(cluster, tmp_path):
    """numarun's trainer (scripts/train.py) under submit: requeue, then every step exactly once."""
    steps = 120
    # a 30 min limit: the 5 min of the other jobs can end a slow run by the real pre-timeout signal
    proc = submit(
        cluster,
        tmp_path,
        "--nproc-per-node",
        "1",
        "--time",
        "30",
        str(REPO / "scripts" / "train.py"),
        f"trainer.steps={steps}",
        "trainer.progress=false",
        wait=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (job_id,) = printed(proc.stdout, "job id")
    run_dir = Path(printed(proc.stdout, "run dir")[0])
    try:
        wait_until("20 trainer steps", lambda: len(_metric_steps(run_dir)) >= 20, 240)
        slurm(cluster, "scontrol", "requeue", job_id)
        _start_requeued_now(cluster, job_id)
        wait_until(
            "the job to end", lambda: not slurm(cluster, "squeue", "-h", "-j", job_id, check=False).stdout.strip(), 300
        )
    finally:
        slurm(cluster, "scancel", job_id, check=False)
    fields = job_fields(cluster, job_id)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", fields
    got = _metric_steps(run_dir)
    assert got == list(range(1, steps + 1)), (
        f"steps lost or repeated around {sorted(set(range(1, steps + 1)) ^ set(got))[:5]}"
    )


SWEEP_APP = """
import os
import socket
from pathlib import Path

import hydra


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def job(cfg):
    node = os.environ.get('SLURMD_NODENAME', socket.gethostname())
    Path(cfg.out, f"job{cfg.x}.rank{os.environ['RANK']}").write_text(node)
    return (cfg.x - 2) ** 2


if __name__ == "__main__":
    job()
"""


def hydra_sweep(
    cluster, tmp_path: Path, *args: str, env: tuple[str, ...] = (), timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python app.py -m hydra/launcher=numarun_slurm ...`` where the cluster's clients run."""
    (tmp_path / "app.py").write_text(SWEEP_APP)
    (tmp_path / "out").mkdir(exist_ok=True)
    options = "[--time,5,--poll-seconds,0.5]"  # the address rule picks the nodes' interface
    return slurm(
        cluster,
        "bash",
        "-c",
        'cd "$0" && exec "$@"',
        str(tmp_path),
        "env",
        *env,
        sys.executable,
        "app.py",
        "-m",
        "hydra/launcher=numarun_slurm",
        f"hydra.launcher.submit_options={options}",
        f"+out={tmp_path / 'out'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *args,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("pack", [None, 2])
def test_hydra_launcher_numarun_slurm_runs_the_sweep_as_a_job_array(cluster, tmp_path, pack):
    """Every job of the sweep an array task on whole nodes (two nodes of one rank each), or two jobs per task
    packed on its node; each job's run dir in Hydra's layout, in the shared sweep dir."""
    nodes = [] if pack else ["hydra.launcher.nnodes=2"]
    proc = hydra_sweep(cluster, tmp_path, "+x=1,2,3", *nodes, *([f"hydra.launcher.pack={pack}"] if pack else []))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = range(1) if pack else range(2)
    written = {p.name: p.read_text() for p in (tmp_path / "out").iterdir()}
    assert sorted(written) == sorted(f"job{x}.rank{r}" for x in (1, 2, 3) for r in ranks)
    if not pack:  # each job's two ranks on the two nodes of its array task
        assert all(written[f"job{x}.rank0"] != written[f"job{x}.rank1"] for x in (1, 2, 3))
    assert sorted(p.parent.parent.name for p in (tmp_path / "sweep").glob("*/.hydra/hydra.yaml")) == ["0", "1", "2"]


def test_an_optuna_sweep_on_slurm_reaches_optuna(cluster, tmp_path):
    (tmp_path / "recording.py").write_text(RECORDING_SAMPLER)
    trials = tmp_path / "trials.jsonl"
    proc = hydra_sweep(
        cluster,
        tmp_path,
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "+x=interval(0,4)",
        "hydra.sweeper.sampler._target_=recording.RecordingSampler",
        env=(f"TRIALS={trials}",),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    told = [json.loads(line) for line in trials.read_text().splitlines()]
    assert len(told) == 4 and all(t["state"] == "COMPLETE" for t in told)
    assert all(t["values"] == [pytest.approx((t["params"]["+x"] - 2) ** 2)] for t in told)
