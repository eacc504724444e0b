"""The per-node side of a Slurm job (numarun.slurm.node and numarun.jobenv.slurm), without Slurm:
node order, the node rank under topology/tree, the exit code and the requeue decision; and the
per-node entry run for real (a fake scontrol on PATH, numarun's own 'run --dry-run')."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import SCRIPTS

from numarun.jobenv.slurm import node_order, parse_leaf_switches, rendezvous_port
from numarun.slurm.node import first_failure, shutdown_grace

TOPOLOGY = (
    "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[1,3]\n"
    "SwitchName=s2 Level=0 LinkSpeed=1 Nodes=node[2,4]\n"
    "SwitchName=s0 Level=1 LinkSpeed=1 Nodes=node[1-4] Switches=s1,s2\n"
)
# addresses that sort, as strings, opposite to the nodes
ADDRS = {"node1": "10.231.0.9", "node2": "10.231.0.10", "node3": "10.230.0.9", "node4": "10.230.0.10"}


def test_node_order_is_slurms_without_topology():
    assert node_order(["node1", "node2", "node10"]) == ["node1", "node2", "node10"]


def test_nodes_under_one_leaf_switch_are_adjacent():
    leaf = parse_leaf_switches(TOPOLOGY)
    assert leaf == {"node1": "s1", "node3": "s1", "node2": "s2", "node4": "s2"}
    assert node_order(["node1", "node2", "node3", "node4"], leaf) == ["node1", "node3", "node2", "node4"]
    # groups follow their first node in Slurm's order; a node under no leaf stands alone
    assert node_order(["node2", "node3", "node4", "node9"], leaf) == ["node2", "node4", "node3", "node9"]
    # one switch: Slurm's order unchanged
    assert node_order(["node1", "node3"], leaf) == ["node1", "node3"]


def test_first_failure_by_time_not_by_size():
    assert first_failure(["200 143\n", "100 3\n"]) == 3
    assert first_failure(["garbage", ""]) is None


def test_grace_is_signal_before_minus_a_margin():
    assert shutdown_grace(120) == 105 and shutdown_grace(300) == 285
    assert shutdown_grace(20) == 15 and shutdown_grace(2) == 1 and shutdown_grace(1) == 1


# ----------------------------------------------------------------------------- run for real

FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_CALLS"
case "$1 $2" in
  "show topology") printf '%s' "$FAKE_TOPOLOGY" ;;
  "show node") addr=$(grep "^$3 " "$FAKE_ADDRS" | cut -d' ' -f2)
    echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr=$addr NodeHostName=h" ;;
  "requeue "*) echo "$*" >> "$FAKE_REQUEUED" ;;
esac
"""


def _step(me: str) -> dict[str, str]:
    """The variables of one task of a 4-node step with one task per node (as srun sets them)."""
    i = ["node1", "node2", "node3", "node4"].index(me)
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node[1-4]",
        "SLURM_STEP_NODELIST": "node[1-4]",
        "SLURM_STEP_NUM_NODES": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "1(x4)",
        "SLURM_NODEID": str(i),
        "SLURM_PROCID": str(i),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": me,
    }


@pytest.fixture
def fake_slurm(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "scontrol").write_text(FAKE_SCONTROL)
    (b / "scontrol").chmod(0o755)
    addrs = tmp_path / "addrs"
    addrs.write_text("".join(f"{n} {a}\n" for n, a in ADDRS.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NUMARUN", "OMPI", "PMI"))}
    env.update(
        PATH=f"{b}:{os.environ['PATH']}",
        FAKE_ADDRS=str(addrs),
        FAKE_TOPOLOGY=TOPOLOGY,
        FAKE_REQUEUED=str(tmp_path / "requeued"),
        FAKE_CALLS=str(tmp_path / "calls"),
        SLURM_JOB_ID="77",
    )
    return env


def _node(env, *args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "numarun", "slurm-node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _calls(tmp_path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_node_task_runs_numarun_with_static_rendezvous_at_the_head(fake_slurm, tmp_path):
    """The batch script's answers handed over: no node asks Slurm anything."""
    script = SCRIPTS / "slurm_ranks.py"
    info = tmp_path / "info"
    info.mkdir()
    (info / "topology").write_text(TOPOLOGY)
    (info / "nodes").write_text(
        "".join(f"NodeName={n} Arch=x86_64 NodeAddr={a} NodeHostName=h\n" for n, a in ADDRS.items())
    )
    env = dict(fake_slurm, **_step("node2"), NUMARUN_SLURM_INFO=str(info))
    proc = _node(
        env,
        "task",
        "--run-dir",
        str(tmp_path),
        "--job-key",
        "77",
        "run",
        "--dry-run",
        "--nproc-per-node",
        "2",
        str(script),
        "--x",
    )
    assert proc.returncode == 0, proc.stderr
    cmd = next(line for line in proc.stdout.splitlines() if " torchrun " in line)
    # node2 sits under switch s2, after node1 and node3 of s1; the head is node1's NodeAddr
    for part in ("--nnodes=4", "--node-rank=2", "--master-addr=10.231.0.9", f"--master-port={rendezvous_port(77, 0)}"):
        assert part in cmd, cmd
    assert "--local-addr" not in cmd  # a static rendezvous advertises nothing: the head's address is the store's
    assert cmd.endswith(f"{script} --x")
    assert "Slurm step 77.0: node 1 of 4, 1 task on this node: per-node mode" in proc.stderr
    assert (
        "node rank 2 of 4: rendezvous 10.231.0.9" in proc.stderr and "node order node1,node3,node2,node4" in proc.stderr
    )
    assert _calls(tmp_path) == []
    assert not list(tmp_path.glob(".numarun-node*.exit"))


@pytest.mark.slow
def test_users_own_srun_asks_slurm_at_most_twice_per_node(fake_slurm, tmp_path):
    """No handed-over answers (a user's own sbatch): the switch map and the head's NodeAddr, once each."""
    script = SCRIPTS / "slurm_ranks.py"
    env = dict(fake_slurm, **_step("node4"))
    proc = subprocess.run(
        [sys.executable, "-m", "numarun", "--dry-run", "--nproc-per-node", "1", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    cmd = next(line for line in proc.stdout.splitlines() if " torchrun " in line)
    for part in ("--nnodes=4", "--node-rank=3", "--master-addr=10.231.0.9", f"--master-port={rendezvous_port(77, 0)}"):
        assert part in cmd, cmd
    assert _calls(tmp_path) == ["show topology", "show node node1"]


@pytest.mark.slow
def test_an_unanswered_switch_map_is_an_error_not_a_different_order_on_some_nodes(fake_slurm, tmp_path):
    (tmp_path / "bin" / "scontrol").write_text('#!/bin/bash\necho "$*" >> "$FAKE_CALLS"\nexit 1\n')
    env = dict(fake_slurm, **_step("node2"))
    script = SCRIPTS / "slurm_ranks.py"
    proc = subprocess.run(
        [sys.executable, "-m", "numarun", "--dry-run", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "'scontrol show topology' did not answer" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # an explicit, quoted --node-rank uses Slurm's order and needs no switch map
    proc = subprocess.run(
        [sys.executable, "-m", "numarun", "--dry-run", "--node-rank", "1", "--master-addr", "127.0.0.1", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_node_task_records_a_failure_and_finish_reports_the_first(fake_slurm, tmp_path):
    env = dict(fake_slurm, **_step("node1"))
    proc = _node(env, "task", "--run-dir", str(tmp_path), "--job-key", "77", "run", "/no/such/script.py")
    assert proc.returncode == 2
    assert (tmp_path / ".numarun-node0.exit").read_text().split()[1] == "2"
    (tmp_path / ".numarun-node3.exit").write_text("1 143\n")  # an earlier failure elsewhere
    fin = _node(env, "finish", "--run-dir", str(tmp_path), "--rc", "143")
    assert fin.returncode == 143 and "step finished with exit code 143" in fin.stdout


@pytest.mark.slow
def test_finish_requeues_after_the_signal_until_the_limit(fake_slurm, tmp_path):
    def finish_preempted(restart_count: int):
        return _node(
            fake_slurm,
            "finish",
            "--run-dir",
            str(tmp_path),
            "--rc",
            "0",
            "--preempted",
            "1",
            "--restart-count",
            str(restart_count),
            "--requeue-limit",
            "2",
        )

    fin = finish_preempted(1)
    assert fin.returncode == 0 and "requeueing job 77 (restart 2 of 2)" in fin.stdout
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "77"]
    fin = finish_preempted(2)
    assert fin.returncode == 0 and "requeue limit 2 reached" in fin.stderr
    assert (tmp_path / "requeued").read_text().count("requeue") == 1


@pytest.mark.slow
def test_finish_reports_a_node_whose_ranks_were_killed_even_when_srun_says_0(fake_slurm, tmp_path):
    """After a signal the node task tells srun 0 (so no other node's save is cut short) and records
    numarun's code; the job's exit code is that record."""
    (tmp_path / ".numarun-node1.exit").write_text("5 143\n")
    fin = _node(fake_slurm, "finish", "--run-dir", str(tmp_path), "--rc", "0")
    assert fin.returncode == 143 and "step finished with exit code 143" in fin.stdout
    # a preempted job still requeues
    fin = _node(
        fake_slurm, "finish", "--run-dir", str(tmp_path), "--rc", "0", "--preempted", "1", "--requeue-limit", "1"
    )
    assert fin.returncode == 0 and "requeueing job 77" in fin.stdout


def test_node_outcome_records_the_code_and_spares_srun_after_a_signal(tmp_path):
    from numarun.slurm.node import node_outcome

    record = tmp_path / "rec"
    assert node_outcome(0, {15}, record=record, node="n1") == 0 and not record.exists()
    assert node_outcome(143, {15}, record=record, node="n1") == 0 and record.read_text().split()[1] == "143"
    assert node_outcome(3, set(), record=record, node="n1") == 3 and record.read_text().split()[1] == "3"


@pytest.mark.slow
def test_a_signal_the_node_task_gets_before_numarun_is_ready_is_held(fake_slurm, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(600)\n")
    step = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_STEP_NODELIST": "node1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": "node1",
    }
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "numarun",
            "slurm-node",
            "task",
            "--run-dir",
            str(tmp_path),
            "--job-key",
            "77",
            "run",
            "--nproc-per-node",
            "1",
            str(script),
        ],
        env=dict(fake_slurm, **step),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()  # the task's first line: its handlers are in, numarun is only starting
    assert line.startswith("numarun: job 77"), line
    p.send_signal(signal.SIGUSR2)
    try:
        out = line + p.communicate(timeout=240)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the signal was lost: numarun and its worker kept running")
    # the held USR2 reached the worker once numarun was ready: it died of it, numarun ended with 1
    assert p.returncode == 0 and "killed by SIGUSR2" in out, out[-3000:]
    assert (tmp_path / ".numarun-node0.exit").read_text().split()[1] == "1"
