"""numarun started by someone else, on this machine: ranks started one per task (Slurm's variables as
srun sets them, each task a real process), and real ``mpirun`` (Open MPI) and ``mpiexec`` (MPICH).

The Slurm test cluster runs the same patterns under a real, confining Slurm
(tests/e2e/test_slurm_patterns.py); these tests need no cluster. The MPI tests need Debian's
``openmpi-bin`` and ``mpich``, which ``scripts/test.sh`` installs as root (``NUMARUN_TEST_MPI=1``);
elsewhere they are skipped, and with ``NUMARUN_TEST_MPI=1`` a missing launcher fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS, TIMEOUT, clean_env, error_lines, free_port, listening, numarun_cmd, wait_until

pytestmark = pytest.mark.slow


def task_env(
    rank: int, *, tasks_per_node: int = 2, nodes: int = 1, job: str = "4321", step: str = "3", **extra: str
) -> dict[str, str]:
    """The variables srun gives task ``rank`` of a step of ``nodes`` x ``tasks_per_node`` tasks (all on this host)."""
    names = [f"n{i}" for i in range(nodes)]
    node = rank // tasks_per_node
    hostlist = names[0] if nodes == 1 else f"n[0-{nodes - 1}]"
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": step,
        "SLURM_STEP_NODELIST": hostlist,
        "SLURM_JOB_NODELIST": hostlist,
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_TASKS": str(nodes * tasks_per_node),
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": names[node],
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % tasks_per_node),
        # the ranks' store: these tasks share this host, whose name 'n0' does not resolve
        "MASTER_ADDR": "127.0.0.1",
    }
    env.update(extra)
    return clean_env(**env)


def start_tasks(
    argv: list[str], count: int, *, cpus: list[set[int]] | None = None, **kw: str
) -> list[subprocess.Popen]:
    procs = []
    for rank in range(count):
        pin = cpus[rank] if cpus else None
        procs.append(
            subprocess.Popen(
                [*numarun_cmd(), *argv],
                cwd=REPO,
                env=task_env(rank, **kw),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=(lambda p=pin: os.sched_setaffinity(0, p)) if pin else None,
            )
        )
    return procs


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        out.append((p.returncode, stdout, stderr))
    return out


def reports(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]


def test_one_task_per_rank_is_one_world_with_rank_equal_procid(tmp_path):
    results = finish(start_tasks([str(SCRIPTS / "slurm_ranks.py"), "--out", str(tmp_path)], 2))
    for rc, _, err in results:
        assert rc == 0, err
        assert "Slurm step 4321.3: node 0 of 1, 2 tasks on this node: per-rank mode" in err
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [r["slurm_procid"] for r in got] == [0, 1]
    assert {r["world_size"] for r in got} == {2} and {r["all_reduce_sum"] for r in got} == {1.0}
    for r in got:
        assert r["affinity"] == r["plan_cpus"], r  # bound as its row of the node's plan
        assert not r["torch_loaded_before_script"], "numarun imported torch before the script"
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(got[0]["affinity"]) & set(got[1]["affinity"]), "two ranks share a CPU"


def test_a_task_the_scheduler_bound_keeps_its_cpus(tmp_path):
    """Never wider than what the task was given (srun --cpu-bind, mpirun --bind-to)."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("needs two CPUs")
    # both tasks bound to the same CPU, the last one: rank 0's plan wants the first
    results = finish(
        start_tasks([str(SCRIPTS / "slurm_ranks.py"), "--out", str(tmp_path)], 2, cpus=[{mine[-1]}, {mine[-1]}])
    )
    assert all(rc == 0 for rc, _, _ in results), results
    for r in reports(tmp_path):
        assert r["affinity"] == [mine[-1]], r


def test_an_unmodified_ddp_script_trains_as_under_torchrun(tmp_path, torchrun_ddp):
    under_rank = tmp_path / "rank.json"
    results = finish(start_tasks([str(SCRIPTS / "ddp_train.py"), str(under_rank)], 2))
    assert all(rc == 0 for rc, _, _ in results), results
    a = json.loads(under_rank.read_text())
    assert a == torchrun_ddp and a["world_size"] == 2


def test_per_rank_sees_what_torchrun_gives_a_worker(tmp_path):
    """The worker environment of per-rank mode against plain torchrun's, key by key."""
    script = tmp_path / "env.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE', "
        "'ROLE_RANK',\n"
        "        'ROLE_WORLD_SIZE', 'ROLE_NAME', 'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS',\n"
        "        'TORCH_NCCL_ASYNC_ERROR_HANDLING']\n"
        "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(json.dumps(\n"
        "    {'env': {k: os.environ.get(k) for k in keys}, 'argv': sys.argv, 'name': __name__, 'path0': "
        "sys.path[0]}))\n"
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    results = finish(start_tasks([str(script), str(tmp_path / "a")], 2))
    assert all(rc == 0 for rc, _, _ in results), results
    t = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), str(tmp_path / "b")],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert t.returncode == 0, t.stderr
    for rank in ("0", "1"):
        ours, theirs = (json.loads((tmp_path / d / rank).read_text()) for d in ("a", "b"))
        ours["argv"][1] = theirs["argv"][1] = "OUT"
        assert ours == theirs


def test_conflicting_options_are_one_line_and_exit_2_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    results = finish(start_tasks(["--nproc-per-node", "2", str(script)], 2))
    for rc, _, err in results:
        assert rc == 2 and len(error_lines(err)) == 1 and "Traceback" not in err, err
        assert "bad --nproc-per-node 2: Slurm step 4321.3 already starts 2 tasks on this node" in err
    results = finish(start_tasks(["--max-restarts", "3", str(script)], 2))
    assert all(rc == 2 and "bad option '--max-restarts': in per-rank mode" in err for rc, _, err in results), results
    assert not marker.exists()  # nothing ran; a task that waited for its peers would have met finish's timeout


def test_malformed_slurm_environment_is_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    p = subprocess.run(
        [*numarun_cmd(), str(script)],
        cwd=REPO,
        env=task_env(0, SLURM_NODEID="abc"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert p.returncode == 2 and error_lines(p.stderr) == [
        "numarun: error: bad Slurm environment: SLURM_NODEID 'abc': expected a whole number >= 0 (numarun runs inside "
        "a Slurm step; NUMARUN_DETECT=0 or --no-detect turns detection off) (see https://numarun.github.io/numarun/slurm/)"
    ], p.stderr


def test_detection_off_runs_as_before(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os; print('WS', os.environ['WORLD_SIZE'])\n")
    for extra in (["--no-detect"], []):
        env = task_env(1, **({} if extra else {"NUMARUN_DETECT": "0"}))
        p = subprocess.run(
            [*numarun_cmd(), *extra, "--nproc-per-node", "1", str(script)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert p.returncode == 0 and "WS 1" in p.stdout and "per-rank mode" not in p.stderr, p.stderr


def test_dry_run_and_plan_say_what_was_detected(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    p = subprocess.run(
        [*numarun_cmd(), "--dry-run", str(script)],
        cwd=REPO,
        env=task_env(1),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "numarun: Slurm step 4321.3: node 0 of 1, 2 tasks on this node: per-rank mode (rank 1 of 2, local rank 1)"
        in p.stderr
    )
    assert "this task is local rank 1" in p.stdout and "RANK=1" in p.stdout and "WORLD_SIZE=2" in p.stdout
    q = subprocess.run(
        [*numarun_cmd(), "plan", "--json"], cwd=REPO, env=task_env(1), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert q.returncode == 0 and "per-rank mode" in q.stderr, q.stderr
    assert len(json.loads(q.stdout)["ranks"]) == 2


# ----------------------------------------------------------------------------- real MPI launchers


def _mpi(launcher: str) -> str:
    path = shutil.which(launcher)
    if path is None:
        if os.environ.get("NUMARUN_TEST_MPI") == "1":
            pytest.fail(
                f"NUMARUN_TEST_MPI=1 but {launcher} is not installed (scripts/test.sh installs openmpi-bin and mpich)"
            )
        pytest.skip(
            f"{launcher} is not installed (Debian's openmpi-bin / mpich; scripts/test.sh installs them as root)"
        )
    return path


MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_plm_rsh_agent": ""}


@pytest.mark.parametrize(
    ("launcher", "argv"),
    [
        ("mpirun.openmpi", ["-np", "2", "--oversubscribe"]),
        ("mpirun.openmpi", ["-np", "2", "--oversubscribe", "--bind-to", "none"]),
        ("mpiexec.mpich", ["-n", "2"]),
    ],
    ids=["openmpi", "openmpi-bind-to-none", "mpich"],
)
def test_mpi_launchers_give_one_bound_world(tmp_path, launcher, argv):
    exe = _mpi(launcher)
    p = subprocess.run(
        [exe, *argv, *numarun_cmd(), str(SCRIPTS / "slurm_ranks.py"), "--out", str(tmp_path)],
        cwd=REPO,
        env=clean_env(**MPI_ENV),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "per-rank mode" in p.stderr
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [r["mpi_rank"] for r in got] == [0, 1]
    assert {r["world_size"] for r in got} == {2} and {r["all_reduce_sum"] for r in got} == {1.0}
    for r in got:
        assert r["affinity"] == r["plan_cpus"] and not r["torch_loaded_before_script"], r
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(got[0]["affinity"]) & set(got[1]["affinity"])


# ----------------------------------------------------------------------------- uneven nodes, any mapping


@pytest.mark.parametrize(
    ("launcher", "argv"),
    [
        # Open MPI: 2 slots on nodea, 1 on nodeb, mapped by node: ranks 0 and 2 on nodea, 1 on nodeb
        (
            "mpirun.openmpi",
            [
                "-np",
                "3",
                "--host",
                "nodea:2,nodeb:1",
                "--map-by",
                "node",
                "--mca",
                "plm_rsh_agent",
                str(SCRIPTS / "fake_ssh"),
            ],
        ),
        # MPICH: by slot on 2 + 1 (rank 2 alone on nodeb), and round robin (ranks 0 and 2 on nodea)
        (
            "mpiexec.mpich",
            ["-n", "3", "-hosts", "nodea:2,nodeb:1", "-launcher", "ssh", "-launcher-exec", str(SCRIPTS / "fake_ssh")],
        ),
        (
            "mpiexec.mpich",
            ["-n", "3", "-hosts", "nodea:1,nodeb:1", "-launcher", "ssh", "-launcher-exec", str(SCRIPTS / "fake_ssh")],
        ),
    ],
    ids=["openmpi-map-by-node", "mpich-by-slot", "mpich-round-robin"],
)
def test_mpi_ranks_on_uneven_nodes_know_their_node(tmp_path, launcher, argv):
    """Two fake nodes (a UTS namespace each, named by the launcher's ssh): every rank's GROUP_RANK is
    its host's place among the hosts by their lowest rank, and the node count is 2."""
    exe = _mpi(launcher)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("fake nodes need unshare --uts as root")
    env = clean_env(**MPI_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo")
    p = subprocess.run(
        [exe, *argv, *numarun_cmd(), str(SCRIPTS / "slurm_ranks.py"), "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    got = reports(tmp_path)
    assert [r["rank"] for r in got] == [0, 1, 2] and {r["all_reduce_sum"] for r in got} == {3.0}, got
    order = list(dict.fromkeys(r["node"] for r in got))
    assert sorted(order) == ["nodea", "nodeb"], got
    for r in got:
        assert r["group_rank"] == order.index(r["node"]), got
        assert r["nproc_per_node"] == sum(s["node"] == r["node"] for s in got), got


RUN_DIR_APP = """
import os
import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base=None, config_path=None)
def main(cfg):
    print("RUNDIR", os.environ["RANK"], HydraConfig.get().runtime.output_dir, flush=True)


main()
"""


def test_per_rank_hydra_app_ranks_share_one_run_dir_with_no_variable_set(tmp_path):
    """Rank 1 starts in a later second than rank 0: one run dir all the same, from rank 0's clock."""
    app = tmp_path / "app.py"
    app.write_text(RUN_DIR_APP)
    port = free_port()
    kw = {"MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
    first = start_tasks([str(app), "hydra.run.dir=" + str(tmp_path / "outputs" / "${now:%H-%M-%S}")], 1, **kw)
    wait_until("rank 0 waiting for the other ranks", lambda: listening(port), proc=first[0])
    read = time.time()  # rank 0 read its clock before it listened
    wait_until("the wall clock's next second", lambda: time.time() >= int(read) + 1)
    procs = [
        *first,
        subprocess.Popen(
            [*numarun_cmd(), str(app), "hydra.run.dir=" + str(tmp_path / "outputs" / "${now:%H-%M-%S}")],
            cwd=REPO,
            env=task_env(1, **kw),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    dirs = {}
    for rc, out, err in finish(procs):
        assert rc == 0 and "NUMARUN_HYDRA_NOW" not in err, err
        dirs.update(line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("RUNDIR "))
    assert sorted(dirs) == ["0", "1"] and dirs["0"] == dirs["1"], dirs
    assert [p.name for p in (tmp_path / "outputs").iterdir()] == [Path(dirs["0"]).name]
