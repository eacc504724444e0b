"""numarun doctor across three "nodes": network namespaces joined by a bridge, one node's link
throttled with tc tbf. The doctor must name that node, and only it, as slow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from numarun.doctor.compare import node_link_figures, pairwise_schedule, slow_nodes
from numarun.doctor.model import Finding, NodeReport, Severity
from numarun.doctor.multinode import judge

pytestmark = pytest.mark.slow

NUMARUN = str(Path(sys.executable).parent / "numarun")
NS = ["doctor-n0", "doctor-n1", "doctor-n2"]
BRIDGE_NS = "doctor-br"
SUBNET = "10.77.13"
SLOW = 2
RATE = "100mbit"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _cleanup() -> None:
    for ns in NS + [BRIDGE_NS]:
        _ip("netns", "del", ns, check=False)


@pytest.fixture
def three_nodes():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    if not shutil.which("ip") or not shutil.which("tc") or not shutil.which("nsenter"):
        pytest.skip("needs ip, tc and nsenter")
    _cleanup()
    try:
        try:
            _ip("netns", "add", BRIDGE_NS)
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create a network namespace: {e.stderr.strip()}")
        br = ["-n", BRIDGE_NS]
        _ip(*br, "link", "add", "br0", "type", "bridge")
        _ip(*br, "link", "set", "br0", "up")
        _ip(*br, "link", "set", "lo", "up")
        for i, ns in enumerate(NS):
            _ip("netns", "add", ns)
            _ip("link", "add", f"dv{i}", "netns", ns, "type", "veth", "peer", "name", f"dp{i}", "netns", BRIDGE_NS)
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", f"dv{i}")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", f"dv{i}", "up")
            _ip(*br, "link", "set", f"dp{i}", "master", "br0")
            _ip(*br, "link", "set", f"dp{i}", "up")
        # both directions of the slow node's link: its own egress and the bridge's egress to it
        for ns, dev in ((NS[SLOW], f"dv{SLOW}"), (BRIDGE_NS, f"dp{SLOW}")):
            subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                            "rate", RATE, "burst", "64kb", "latency", "50ms"], check=True, capture_output=True)
        yield [f"{SUBNET}.{i + 1}" for i in range(len(NS))]
    finally:
        _cleanup()


def test_three_nodes_name_the_throttled_one(three_nodes, tmp_path):
    addrs = three_nodes
    port = "29613"
    procs = []
    for rank, ns in enumerate(NS):
        cmd = ["nsenter", f"--net=/run/netns/{ns}", NUMARUN, "doctor", "--json", "--nnodes", str(len(NS)),
               "--node-rank", str(rank), "--master-addr", addrs[0], "--master-port", port, "--doctor-timeout", "120"]
        out = open(tmp_path / f"n{rank}.out", "w")
        err = open(tmp_path / f"n{rank}.err", "w")
        procs.append((subprocess.Popen(cmd, stdout=out, stderr=err), out, err))
    codes = []
    for p, out, err in procs:
        try:
            codes.append(p.wait(timeout=300))
        finally:
            if p.poll() is None:
                p.kill()
            out.close()
            err.close()
    results = [json.loads((tmp_path / f"n{r}.out").read_text() or "null") for r in range(len(NS))]
    detail = [(tmp_path / f"n{r}.err").read_text()[-2000:] for r in range(len(NS))]
    assert all(r is not None for r in results), detail
    head = results[0]
    assert head["slow_nodes"] == [SLOW], (head["nodes"], detail)
    assert [f["device"] for f in head["findings"] if f["check"] == "slow-node"] == [f"node {SLOW}"]
    # every node gets the verdict and stops on it: the slow node is an error everywhere
    assert codes == [1, 1, 1]
    assert all(r["slow_nodes"] == [SLOW] for r in results)
    nodes = {n["node_rank"]: n for n in head["nodes"]}
    assert sorted(nodes) == [0, 1, 2]
    assert all(n["figures"]["mem_bw_gbs"] for n in nodes.values())  # measured per NUMA node
    link = {r: n["figures"]["link_gbs"] for r, n in nodes.items()}
    assert link[SLOW] * 2 < min(link[0], link[1])
    assert head["seconds"] < 60


def test_a_node_that_never_comes_is_named_in_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    p = subprocess.run([NUMARUN, "doctor", "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                        "--master-port", port, "--doctor-timeout", "3", "--no-measure"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = [l for l in p.stderr.splitlines() if l.startswith("numarun")]
    assert p.returncode == 1, p.stderr[-2000:]
    assert len(lines) == 1 and "node rank(s) 1" in lines[0] and "--doctor-timeout" in lines[0]
    assert "Traceback" not in p.stderr


# --- pure parts ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_pairwise_schedule_covers_every_pair_once_without_overlap(n):
    rounds = pairwise_schedule(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        ends = [x for p in r for x in p]
        assert len(ends) == len(set(ends))


def test_slow_node_stands_out_from_its_peers():
    fast, slow = 1.0, 0.05
    directed = {}
    for a in range(4):
        for b in range(4):
            if a != b:
                directed[(a, b)] = slow if 3 in (a, b) else fast
    figures = node_link_figures(directed, 4)
    assert slow_nodes(figures, 0.5) == [3]
    # two nodes cannot tell a slow node from a slow link
    assert slow_nodes(node_link_figures({(0, 1): 1.0, (1, 0): 0.01}, 2), 0.5) == []


def _report(rank: int, **facts) -> NodeReport:
    base = {"gpu_count": 8, "gpu_models": ["NVIDIA H100"], "compute_nics": ["mlx5_0"], "torch": "2.9.0"}
    return NodeReport(rank, f"host{rank}", (), {**base, **facts}, {"recv_gbs": {}})


def test_judge_names_the_node_that_differs():
    reports = [_report(0), _report(1, gpu_count=7), _report(2, torch="2.8.0")]
    verdict = judge(reports, min_link_fraction=0.5)
    mism = [f for f in verdict["findings"] if f["check"] == "node-mismatch"]
    assert {(f["device"], f["severity"]) for f in mism} == {("nodes 1", "error"), ("nodes 2", "warn")}
    assert verdict["bad_nodes"] == [1] and verdict["exclude"] == "host1" and verdict["ok"] is False


def test_judge_collects_each_nodes_errors():
    bad = NodeReport(1, "host1", (Finding(Severity.ERROR, "rdma-port", "mlx5_0:1", "down"),), _report(1).facts, {})
    verdict = judge([_report(0), bad, _report(2)], min_link_fraction=0.5)
    assert verdict["bad_nodes"] == [1] and verdict["ok"] is False and verdict["findings"] == []
