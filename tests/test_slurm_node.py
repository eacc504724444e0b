"""The per-node side of a Slurm job (numarun.slurm.node), without Slurm: node order, head and
port, the node rank under topology/tree, the exit code and the requeue decision; and the
per-node entry run for real (a fake scontrol on PATH, numarun's own 'run --dry-run')."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from numarun.errors import SlurmError
from numarun.slurm.node import (
    first_failure,
    node_order,
    parse_leaf_switches,
    parse_node_addr,
    physical_gpus,
    plan_node_task,
    rendezvous_port,
    should_requeue,
    shutdown_grace,
)

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


def _env(me: str, nodelist: str = "node[1-2]", job: str = "4242") -> dict[str, str]:
    return {"SLURM_JOB_NODELIST": nodelist, "SLURMD_NODENAME": me, "SLURM_JOB_ID": job}


def test_node_rank_is_slurms_node_index_whatever_the_addresses():
    for rank, me in enumerate(["node1", "node2"]):
        task = plan_node_task(_env(me), topology_text="", node_addrs=ADDRS)
        assert task.node_rank == rank and task.nnodes == 2
        assert task.head_addr == "10.231.0.9" and task.local_addr == ADDRS[me]
        assert task.port == rendezvous_port(4242) == 15000 + 4242
        opts = task.run_options()
        assert opts[opts.index("--rdzv-backend") + 1] == "static"
        assert opts[opts.index("--node-rank") + 1] == str(rank)
        assert opts[opts.index("--master-addr") + 1] == "10.231.0.9"


def test_node_rank_groups_by_switch_on_four_nodes():
    ranks = {me: plan_node_task(_env(me, "node[1-4]"), topology_text=TOPOLOGY, node_addrs=ADDRS).node_rank
             for me in ADDRS}
    assert ranks == {"node1": 0, "node3": 1, "node2": 2, "node4": 3}


def test_port_stays_below_the_ephemeral_range():
    assert all(15000 <= rendezvous_port(j) < 30000 for j in (0, 1, 14999, 15000, 10**9 + 7))


def test_bad_slurm_environment_is_one_line():
    with pytest.raises(SlurmError, match="SLURMD_NODENAME one of the nodes"):
        plan_node_task(_env("other"), topology_text="", node_addrs={})
    with pytest.raises(SlurmError, match="SLURM_JOB_NODELIST"):
        plan_node_task({"SLURMD_NODENAME": "n1"}, topology_text="", node_addrs={})
    with pytest.raises(SlurmError, match="numeric job id"):
        plan_node_task(_env("node1", job="x"), topology_text="", node_addrs={})


def test_node_addr_from_scontrol_show_node():
    text = "NodeName=node2 Arch=x86_64 CoresPerSocket=2\n   NodeAddr=10.231.0.10 NodeHostName=vm Version=22.05.8\n"
    assert parse_node_addr(text) == "10.231.0.10"
    assert parse_node_addr("") is None


def test_gpus_renumbered_by_constrain_devices_map_back_to_the_nodes_indices():
    # ConstrainDevices: the step holds GPUs 1 and 3; CUDA sees them as 0 and 1
    assert physical_gpus("0,1", "1,3") == "1,3"
    assert physical_gpus("1,0", "3,1") == "3,1"
    assert physical_gpus("0", "1") == "1"
    # no confinement: Slurm's indices are CUDA's
    assert physical_gpus("1,3", "1,3") is None and physical_gpus("0", "0") is None
    assert physical_gpus(None, "1") is None and physical_gpus("0", None) is None
    assert physical_gpus("GPU-1234", "1") is None and physical_gpus("5", "1") is None


def test_first_failure_by_time_not_by_size():
    assert first_failure(["200 143\n", "100 3\n"]) == 3
    assert first_failure(["garbage", ""]) is None


def test_requeue_decision():
    assert should_requeue(True, 0, 3) and should_requeue(True, 2, 3)
    assert not should_requeue(True, 3, 3) and not should_requeue(False, 0, 3)


def test_grace_is_signal_before_minus_a_margin():
    assert shutdown_grace(120) == 105 and shutdown_grace(300) == 285
    assert shutdown_grace(20) == 15 and shutdown_grace(2) == 1 and shutdown_grace(1) == 1


# ----------------------------------------------------------------------------- run for real

FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show topology") printf '%s' "$FAKE_TOPOLOGY" ;;
  "show node") echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr=$(grep "^$3 " "$FAKE_ADDRS" | cut -d' ' -f2) NodeHostName=h" ;;
  "requeue "*) echo "$*" >> "$FAKE_REQUEUED" ;;
esac
"""


@pytest.fixture
def fake_slurm(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "scontrol").write_text(FAKE_SCONTROL)
    (b / "scontrol").chmod(0o755)
    addrs = tmp_path / "addrs"
    addrs.write_text("".join(f"{n} {a}\n" for n, a in ADDRS.items()))
    env = dict(os.environ, PATH=f"{b}:{os.environ['PATH']}", FAKE_ADDRS=str(addrs), FAKE_TOPOLOGY=TOPOLOGY,
               FAKE_REQUEUED=str(tmp_path / "requeued"), SLURM_JOB_NODELIST="node[1-4]", SLURM_JOB_ID="77")
    return env


def _node(env, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "numarun", "slurm-node", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.mark.slow
def test_node_task_runs_numarun_with_static_rendezvous_at_the_head(fake_slurm, tmp_path):
    script = Path(__file__).parent / "scripts" / "slurm_ranks.py"
    env = dict(fake_slurm, SLURMD_NODENAME="node2")
    proc = _node(env, "task", "--run-dir", str(tmp_path), "--job-key", "77", "run", "--dry-run", "--nproc-per-node", "2", str(script), "--x")
    assert proc.returncode == 0, proc.stderr
    cmd = next(line for line in proc.stdout.splitlines() if " torchrun " in line)
    # node2 sits under switch s2, after node1 and node3 of s1; the head is node1's NodeAddr
    for part in ("--nnodes=4", "--node-rank=2", "--master-addr=10.231.0.9", "--master-port=15077", "--local-addr=10.231.0.10"):
        assert part in cmd, cmd
    assert cmd.endswith(f"{script} --x")
    assert not list(tmp_path.glob(".numarun-node*.exit"))


@pytest.mark.slow
def test_node_task_records_a_failure_and_finish_reports_the_first(fake_slurm, tmp_path):
    env = dict(fake_slurm, SLURMD_NODENAME="node1")
    proc = _node(env, "task", "--run-dir", str(tmp_path), "--job-key", "77", "run", "/no/such/script.py")
    assert proc.returncode == 2
    assert (tmp_path / ".numarun-node0.exit").read_text().split()[1] == "2"
    (tmp_path / ".numarun-node3.exit").write_text("1 143\n")  # an earlier failure elsewhere
    fin = _node(env, "finish", "--run-dir", str(tmp_path), "--rc", "143")
    assert fin.returncode == 143 and "step finished with exit code 143" in fin.stdout


@pytest.mark.slow
def test_finish_requeues_after_the_signal_until_the_limit(fake_slurm, tmp_path):
    fin = _node(fake_slurm, "finish", "--run-dir", str(tmp_path), "--rc", "0", "--preempted", "1", "--restart-count", "1", "--requeue-limit", "2")
    assert fin.returncode == 0 and "requeueing job 77 (restart 2 of 2)" in fin.stdout
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "77"]
    fin = _node(fake_slurm, "finish", "--run-dir", str(tmp_path), "--rc", "0", "--preempted", "1", "--restart-count", "2", "--requeue-limit", "2")
    assert fin.returncode == 0 and "requeue limit 2 reached" in fin.stderr
    assert (tmp_path / "requeued").read_text().count("requeue") == 1
