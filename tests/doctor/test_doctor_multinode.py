"""numarun doctor across "nodes" in network namespaces joined by a bridge, with tc tbf throttles.

Three nodes (all pairs), one node's link throttled: the doctor names that node, and only it,
as slow. Six nodes under the bounded schedule, one node throttled and the link between two
other nodes throttled: the doctor names the node as a node and the link as a link.
(The pure parts are in test_doctor_scale.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port
from netns import namespace_nodes

from numarun.doctor.schedule import MAX_ROUNDS, all_pairs_rounds

pytestmark = pytest.mark.slow

NUMARUN = str(Path(sys.executable).parent / "numarun")
NS = ["doctor-n0", "doctor-n1", "doctor-n2"]
BRIDGE_NS = "doctor-br"
SUBNET = "10.77.13"
SLOW = 2


def _run_doctor(names: list[str], addrs: list[str], port: str, tmp_path: Path, *options: str):
    """``numarun doctor --json`` on every namespace node; (exit codes, results, stderr tails)."""
    procs = []
    for rank, ns in enumerate(names):
        cmd = [
            "nsenter",
            f"--net=/run/netns/{ns}",
            NUMARUN,
            "doctor",
            "--json",
            "--nnodes",
            str(len(names)),
            "--node-rank",
            str(rank),
            "--master-addr",
            addrs[0],
            "--master-port",
            port,
            "--doctor-timeout",
            "120",
            *options,
        ]
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
    results = [json.loads((tmp_path / f"n{r}.out").read_text() or "null") for r in range(len(names))]
    detail = [(tmp_path / f"n{r}.err").read_text()[-2000:] for r in range(len(names))]
    assert all(r is not None for r in results), detail
    return codes, results, detail


@pytest.fixture
def three_nodes():
    with namespace_nodes(NS, BRIDGE_NS, SUBNET, slow_node=SLOW) as addrs:
        yield addrs


def test_three_nodes_name_the_throttled_one(three_nodes, tmp_path):
    codes, results, detail = _run_doctor(NS, three_nodes, "29613", tmp_path)
    head = results[0]
    assert head["slow_nodes"] == [SLOW], (head["nodes"], detail)
    assert [f["device"] for f in head["findings"] if f["check"] == "slow-node"] == [f"node {SLOW}"]
    assert head["slow_links"] == [] and head["links"]["schedule"]["name"] == "all-pairs"
    # every node gets the verdict and stops on it: the slow node is an error everywhere
    assert codes == [1, 1, 1]
    assert all(r["slow_nodes"] == [SLOW] for r in results)
    nodes = {n["node_rank"]: n for n in head["nodes"]}
    assert sorted(nodes) == [0, 1, 2]
    assert all(n["figures"]["mem_bw_gbs"] for n in nodes.values())  # measured per NUMA node
    link = {r: n["figures"]["link_gbs"] for r, n in nodes.items()}
    assert link[SLOW] * 2 < min(link[0], link[1])
    # the doctor's own bound, without a clock: every pair once, in all-pairs' rounds (three nodes: one sits out each
    # round), every node against both others; no node waited out --doctor-timeout (each has the verdict above)
    links = head["links"]
    assert links["schedule"]["rounds"] == all_pairs_rounds(len(NS)) == 3 and links["pairs_measured"] == 3
    assert all(n["figures"]["link_peers"] == len(NS) - 1 for n in nodes.values())


SIX = [f"dscale-n{i}" for i in range(6)]
SIX_BRIDGE = "dscale-br"
SIX_SUBNET = "10.77.14"
SIX_SLOW = 4
SIX_SLOW_LINK = (1, 2)


def test_six_nodes_bounded_name_the_slow_node_and_the_slow_link(tmp_path):
    with namespace_nodes(SIX, SIX_BRIDGE, SIX_SUBNET, slow_node=SIX_SLOW, slow_links=(SIX_SLOW_LINK,)) as addrs:
        t0 = time.monotonic()
        # the streams here are CPU-bound (three pairs at once on a shared host of two cores, beside the rest of
        # the suite): a healthy pair can measure at a tenth of another; the throttled ones (100 Mbit/s against
        # 1-2 GB/s) are more than a hundred times below, so a twentieth still tells them apart
        codes, results, detail = _run_doctor(
            SIX, addrs, "29614", tmp_path, "--no-measure", "--link-schedule", "bounded", "--min-link-fraction", "0.05"
        )
        wall = time.monotonic() - t0
    head = results[0]
    nodes = {n["node_rank"]: n["figures"] for n in head["nodes"]}
    assert head["slow_nodes"] == [SIX_SLOW], (nodes, detail)
    assert [tuple(x[:2]) for x in head["slow_links"]] == [SIX_SLOW_LINK], (nodes, detail)
    devices = sorted((f["check"], f["device"]) for f in head["findings"])
    assert devices == [("slow-link", "nodes 1-2"), ("slow-node", f"node {SIX_SLOW}")]
    schedule = head["links"]["schedule"]
    assert schedule["name"] == "bounded" and schedule["rounds"] <= MAX_ROUNDS
    # every node was measured against several distinct peers; the ends of the slow link are not slow nodes
    assert min(f["link_peers"] for f in nodes.values()) >= 3
    assert head["bad_nodes"] == [SIX_SLOW]
    assert codes == [1] * 6 and all(
        r["slow_nodes"] == [SIX_SLOW] and r["slow_links"] == head["slow_links"] for r in results
    )
    print(
        f"six namespace nodes: {wall:.1f} s wall, {head['seconds']} s from the store to the verdict, "
        f"{schedule['rounds']} rounds"
    )


def test_a_node_that_never_comes_is_named_in_one_line(tmp_path):
    port = str(free_port())
    p = subprocess.run(
        [
            NUMARUN,
            "doctor",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "--doctor-timeout",
            "3",
            "--no-measure",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("numarun")]
    assert p.returncode == 1, p.stderr[-2000:]
    assert len(lines) == 1 and "node rank(s) 1" in lines[0] and "--doctor-timeout" in lines[0]
    assert "Traceback" not in p.stderr
