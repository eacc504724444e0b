"""Layouts in real gloo jobs: numarun.init()'s DeviceMesh has the groups the plan printed, each rank on the GPU the
plan gave it; under c10d the nodes take node ranks in the order of the keys they report, not of their addresses.
Two small jobs (4 ranks on one node; 2 nodes of 1 rank each), a few seconds each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import SCRIPTS, TIMEOUT, clean_env, free_port, listening, numarun_cmd, run_numarun, wait_until
from topo_helpers import FIXTURES, build_topology

from numarun.topology.discover import merge_nvml
from numarun.topology.nvml import reading_from_record

pytestmark = pytest.mark.slow


def crossed_here(tmp_path: Path) -> Path:
    """The 4-GPU board whose NVLink bridges pair GPUs 0-2 and 1-3, on two one-CPU NUMA nodes (CPUs 0 and 1 exist
    on every machine the tests run on)."""
    reading = reading_from_record(json.loads((FIXTURES / "nvml" / "constructed-4gpu-crossed-nvlink.json").read_text()))
    t = merge_nvml(build_topology(nodes=2, cores_per_node=1, threads_per_core=1, gpu_nodes=()), reading)
    path = tmp_path / "crossed.json"
    path.write_text(t.to_json())
    return path


def test_init_mesh_groups_are_the_printed_ones(tmp_path: Path) -> None:
    topology = crossed_here(tmp_path)
    args = [
        "--topology",
        str(topology),
        "--binding",
        "node",
        "--mem-policy",
        "none",
        "--nproc-per-node",
        "4",
        "--mesh",
        "dp_shard=2,tp=2",
    ]
    shown = run_numarun("plan", *args, "--json")
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)
    table = run_numarun("plan", *args).stdout
    out = tmp_path / "out"
    out.mkdir()
    proc = run_numarun(*args, str(SCRIPTS / "mesh_ranks.py"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    reports = {r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank-*.json"))}
    assert sorted(reports) == [0, 1, 2, 3]
    gpu = {r["local_rank"]: r["gpu"]["index"] for r in plan["ranks"]}
    assert gpu == {0: 0, 1: 2, 2: 1, 3: 3}  # tp's pairs on the NVLink bridges
    printed = {d["name"]: [list(g) for g in d["groups"]] for d in plan["mesh"]["dims"]}
    assert printed == {"dp_shard": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}
    assert "0,1→0,2  2,3→1,3" in table and "tp: 2 groups on NV4; default order: 2 groups through NODE" in table
    for rank, r in reports.items():
        assert r["names"] == ["dp_shard", "tp"] and r["shape"] == [2, 2]
        for name, groups in printed.items():
            mine = next(g for g in groups if rank in g)
            assert r["groups"][name] == mine  # torch's own rank list of the mesh dimension's group
            assert r["sums"][name] == float(sum(mine))  # and a collective over it
        assert r["gpu_index"] == gpu[rank] and r["cuda_index"] == rank
        assert r["cuda_visible_devices"] == plan["mesh"]["cuda_visible_devices"]
        assert (
            r["cuda_visible_devices"].split(",")[rank]
            == plan["ranks"][rank]["env"]["CUDA_VISIBLE_DEVICES"].split(",")[rank]
        )
        assert r["env"]["NUMARUN_MESH"] == "dp_shard=2,tp=2" and r["env"]["NUMARUN_MESH_TP"] == "2"


def test_c10d_gives_node_ranks_in_key_order(tmp_path: Path) -> None:
    """Two nodes on one host, started in pid order, report keys in the other order: with a layout, the later one
    (key 'a') is node 0; torch alone would sort them by address, then pid."""
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    procs = []
    for key in ("b", "a"):
        argv = [
            *numarun_cmd(),
            "--binding",
            "none",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--mesh",
            "dp_shard=-1",
            str(SCRIPTS / "mesh_ranks.py"),
            "--out",
            str(out),
        ]
        procs.append(
            subprocess.Popen(
                argv, env=clean_env(NUMARUN_NODE_KEY=key), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
        if key == "b":  # the first node hosts the store (lower pid): the second joins once it listens
            wait_until("the c10d store", lambda: listening(port), TIMEOUT, proc=procs[0])
    results = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
        finally:
            p.kill()
        results.append((p.returncode, stderr))
    assert all(code == 0 for code, _ in results), results
    assert any("node order key /a/" in err for _, err in results), results
    reports = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    assert {r["node_key"]: r["node_rank"] for r in reports} == {"a": 0, "b": 1}
