"""Multi-process gloo tests: several "nodes" on one host, each started by its own launcher.

Two launcher processes (``--nnodes 2 --node-rank 0/1``, one master port) per job; one worker
script runs many checks per job so that the whole file starts only three small jobs:
2x3 ranks (groups, context, hierarchical == flat, AVG, DDP hook), 2+1 ranks (unequal nodes),
and 2x2 ranks through ``numarun bench allreduce`` (the CLI path end to end).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, free_port

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 300  # a hang must fail the test, not the CI run

WORKER = textwrap.dedent(
    r"""
    import json, os, sys
    import torch
    import torch.distributed as dist

    import numarun
    from numarun.comm.allreduce import apply_comm, hierarchical_all_reduce
    from numarun.errors import NumarunError

    out_dir = sys.argv[1]
    mode = sys.argv[2]
    ctx = numarun.init()
    report = {
        "rank": ctx.rank, "local_rank": ctx.local_rank, "world_size": ctx.world_size,
        "node_rank": ctx.node_rank, "num_nodes": ctx.num_nodes, "local_world_size": ctx.local_world_size,
        "backend": ctx.backend, "device": str(ctx.device), "binding": ctx.binding is not None,
        "same_context": numarun.init() is ctx,
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")},
        "intra": dist.get_process_group_ranks(ctx.intra_group),
        "inter": dist.get_process_group_ranks(ctx.inter_group) if ctx.inter_group is not None else None,
        "mesh": None if ctx.mesh is None else {
            "names": list(ctx.mesh.mesh_dim_names), "shape": list(ctx.mesh.mesh.shape),
            "intra": dist.get_process_group_ranks(ctx.mesh.get_group("intra")),
            "inter": dist.get_process_group_ranks(ctx.mesh.get_group("inter")),
        },
        "failures": [],
    }
    fail = report["failures"]
    world, rank = ctx.world_size, ctx.rank

    def data(numel, dtype, shape=None):
        # integer-valued, different on every rank: sums are exact in fp32/bf16/fp16 at these sizes
        g = torch.Generator().manual_seed(1000 + rank)
        t = torch.randint(-8, 9, (numel,), generator=g).to(dtype)
        return t.view(shape) if shape else t

    def flat_ref(t, op):
        ref = t.clone()
        if op == "avg":
            dist.all_reduce(ref, op=dist.ReduceOp.SUM)
            ref = ref / world
        else:
            dist.all_reduce(ref, op=getattr(dist.ReduceOp, op.upper()))
        return ref

    if mode == "uniform":
        cases = 0
        for numel in (1, 2, 5, 7, 1001, 4099):
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                for op in ("sum", "avg", "max"):
                    t = data(numel, dtype)
                    ref = flat_ref(t, op)
                    got = t.clone()
                    out = hierarchical_all_reduce(got, getattr(dist.ReduceOp, op.upper()))
                    cases += 1
                    if out is not got:
                        fail.append(f"not in place: {numel} {dtype} {op}")
                    exact = op != "avg" or dtype == torch.float32
                    close = torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2)
                    ok = torch.equal(got, ref) if exact else close
                    if not ok:
                        worst = (got.float() - ref.float()).abs().max().item()
                        fail.append(f"hier != flat: numel={numel} {dtype} {op} max|d|={worst}")
        report["cases"] = cases
        # pipelined path (many small chunks; odd sizes, so the tensor is padded); spy that it ran
        import numarun.comm.pipeline as P
        real, runs = P.run, []
        P.run = lambda *a, **k: (runs.append(1), real(*a, **k))
        for numel in (1001, 4099):
            for dtype in (torch.float32, torch.bfloat16):
                t = data(numel, dtype)
                ref = flat_ref(t, "sum")
                got = t.clone()
                hierarchical_all_reduce(got, chunk_bytes=96)
                if not torch.equal(got, ref):
                    fail.append(f"pipelined hier != flat: numel={numel} {dtype}")
                report["pipelined_cases"] = report.get("pipelined_cases", 0) + 1
        P.run = real
        report["pipelined_runs"] = len(runs)
        # non-contiguous 2-D tensor, reduced in place through its view
        base = data(7 * 5, torch.float32, (7, 5))
        view = base.t()
        ref = flat_ref(view.contiguous(), "sum")
        hierarchical_all_reduce(view)
        if not torch.equal(view, ref):
            fail.append("non-contiguous view differs")
        # bf16 on the wire between nodes only: close to the exact sum, not necessarily equal
        t = torch.randn(3001, generator=torch.Generator().manual_seed(rank))
        ref = flat_ref(t, "sum")
        hierarchical_all_reduce(t, inter_dtype=torch.bfloat16)
        report["bf16_wire_max_err"] = (t - ref).abs().max().item()
        if not torch.allclose(t, ref, rtol=2e-2, atol=5e-2):
            fail.append(f"bf16 inter-node compression too far off: {report['bf16_wire_max_err']}")

        # DDP: the hierarchical hook ends where plain DDP ends
        from torch.nn.parallel import DistributedDataParallel as DDP

        def train(comm, compression, **options):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(13, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))
            ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets, one with an odd element count
            if comm is not None:
                apply_comm(ddp, comm, compression, ctx, **options)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            g = torch.Generator().manual_seed(50 + rank)
            for _ in range(5):
                x = torch.randn(8, 13, generator=g)
                y = torch.randn(8, 3, generator=g)
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            return torch.cat([p.detach().flatten() for p in model.parameters()])

        plain = train(None, None)
        hier = train("hierarchical", None)
        comp = train("hierarchical", "bf16")
        flat_bf16 = train("flat", "bf16")
        # the backward pass's buckets in one pipeline, several chunks per bucket (64 bytes),
        # with and without compression; and each bucket reduced inside the hook
        streamed = train("hierarchical", None, chunk_bytes=64)
        streamed_bf16 = train("hierarchical", "bf16", chunk_bytes=64)
        in_hook = train("hierarchical", None, overlap=False)
        report["ddp_streamed_max_diff"] = (streamed - plain).abs().max().item()
        report["ddp_in_hook_max_diff"] = (in_hook - plain).abs().max().item()
        if not torch.allclose(streamed, plain, rtol=1e-5, atol=1e-6):
            fail.append(f"DDP hierarchical, 64-byte chunks != plain: {report['ddp_streamed_max_diff']}")
        if not torch.allclose(streamed_bf16, comp, rtol=0, atol=1e-6):
            fail.append("DDP hierarchical+bf16 depends on the chunk size")
        if not torch.allclose(in_hook, plain, rtol=1e-5, atol=1e-6):
            fail.append(f"DDP hierarchical in the hook != plain: {report['ddp_in_hook_max_diff']}")
        report["ddp_hier_max_diff"] = (hier - plain).abs().max().item()
        report["ddp_bf16_max_diff"] = (comp - plain).abs().max().item()
        report["ddp_flat_bf16_max_diff"] = (flat_bf16 - plain).abs().max().item()
        report["ddp_deterministic"] = (plain - train(None, None)).abs().max().item() == 0.0
        if not torch.allclose(hier, plain, rtol=1e-5, atol=1e-6):
            fail.append(f"DDP hierarchical != plain: {report['ddp_hier_max_diff']}")
        if not torch.allclose(comp, plain, rtol=0, atol=2e-2):
            fail.append(f"DDP hierarchical+bf16 too far: {report['ddp_bf16_max_diff']}")
        # params are identical across ranks (DDP's contract), checked with a flat all-reduce
        m = hier.clone(); dist.all_reduce(m, op=dist.ReduceOp.MAX)
        if not torch.equal(m, hier):
            fail.append("DDP hierarchical params differ across ranks")
    else:
        t = data(11, torch.float32)
        ref = t.clone()
        dist.all_reduce(ref)
        report["flat_ok"] = bool(torch.equal(ref, flat_ref(t, "sum")))
        try:
            hierarchical_all_reduce(t)
            report["hier_error"] = None
        except NumarunError as e:
            report["hier_error"] = str(e)
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(torch.nn.Linear(3, 1))
        try:
            apply_comm(ddp, "hierarchical", None, ctx)
            report["apply_error"] = None
        except NumarunError as e:
            report["apply_error"] = str(e)
        report["apply_flat"] = apply_comm(ddp, "flat", None, ctx).value
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(REPO))
    env.pop("NUMARUN_PLAN", None)
    return env


def _run_nodes(cmds: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Start one launcher per node, wait for all; kill the lot on timeout."""
    procs = [
        subprocess.Popen(
            c, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for c in cmds
    ]
    done = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=JOB_TIMEOUT_S)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"job did not finish within {JOB_TIMEOUT_S}s: {cmds}")
    return done


def _torchrun_nodes(tmp_path: Path, nprocs: list[int], mode: str) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    cmds = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(nprocs)}",
            f"--node-rank={i}",
            f"--nproc-per-node={n}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            str(script),
            str(tmp_path),
            mode,
        ]
        for i, n in enumerate(nprocs)
    ]
    for r in _run_nodes(cmds, tmp_path):
        assert r.returncode == 0, r.stdout[-4000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(reports) == sum(nprocs)
    return sorted(reports, key=lambda r: r["rank"])


def test_two_nodes_of_three(tmp_path: Path) -> None:
    n, g = 2, 3
    reports = _torchrun_nodes(tmp_path, [g] * n, "uniform")
    for rank, r in enumerate(reports):
        assert r["failures"] == [], r["failures"]
        node, local = int(r["env"]["GROUP_RANK"]), int(r["env"]["LOCAL_RANK"])
        assert (r["rank"], r["world_size"], r["num_nodes"], r["local_world_size"]) == (rank, n * g, n, g)
        assert (r["node_rank"], r["local_rank"]) == (node, local)
        assert (r["backend"], r["device"], r["binding"], r["same_context"]) == ("gloo", "cpu", False, True)
        # torchrun numbers nodes contiguously: node n holds n*G .. n*G+G-1
        assert rank == node * g + local
        assert r["intra"] == [node * g + i for i in range(g)]
        assert r["inter"] == [m * g + local for m in range(n)]
        assert r["mesh"] == {"names": ["inter", "intra"], "shape": [n, g], "intra": r["intra"], "inter": r["inter"]}
        assert r["cases"] == 6 * 3 * 3
        assert r["pipelined_cases"] == r["pipelined_runs"] == 4
        assert 0 < r["bf16_wire_max_err"]  # compression really happened on the wire
        assert r["ddp_hier_max_diff"] < 1e-5
        assert 0 < r["ddp_bf16_max_diff"] < 2e-2
        assert r["ddp_flat_bf16_max_diff"] > 0
        assert r["ddp_deterministic"]


def test_unequal_nodes_flat_works_hierarchical_is_a_clear_error(tmp_path: Path) -> None:
    reports = _torchrun_nodes(tmp_path, [2, 1], "unequal")
    for r in reports:
        assert r["failures"] == []
        assert r["num_nodes"] == 2 and r["world_size"] == 3
        assert r["flat_ok"] is True
        assert r["inter"] is None and r["mesh"] is None
        assert r["local_world_size"] == (2 if r["node_rank"] == 0 else 1)
        assert "nodes run 2,1 ranks" in r["hier_error"] and "comm.allreduce=flat" in r["hier_error"]
        assert r["apply_error"] == r["hier_error"]
        assert r["apply_flat"] == "flat"


def test_bench_cli_two_nodes(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "bench.json"
    base = [
        sys.executable,
        "-m",
        "numarun",
        "bench",
        "allreduce",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--sizes",
        "4K,1001",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--link-rate",
        "100mbit",
    ]
    results = _run_nodes([base + ["--node-rank", "0", "--json-file", str(out)], base + ["--node-rank", "1"]], tmp_path)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
    assert "hier/flat" in results[0].stdout and "flat == hierarchical" in results[0].stdout
    rep = json.loads(out.read_text())
    assert (rep["world_size"], rep["num_nodes"], rep["local_world_size"], rep["backend"]) == (4, 2, 2, "gloo")
    assert rep["correct"] == {"4096": True, "1001": True}
    assert sorted((x["size_bytes"], x["mode"]) for x in rep["results"]) == [
        (1001, "flat"),
        (1001, "hierarchical"),
        (4096, "flat"),
        (4096, "hierarchical"),
    ]
    for x in rep["results"]:
        assert len(x["times_s"]) == 2 and x["median_s"] > 0
        assert x["busbw_gbps"] == pytest.approx(x["algbw_gbps"] * 1.5)
    assert rep["bound_ratio"] == pytest.approx(2 / 3)
    # started through 'numarun run': rank 0 got its CPUs from the plan
    assert rep["rank0_cpus"] and all(isinstance(c, int) for c in rep["rank0_cpus"])
    for c in rep["comparisons"]:
        assert c["hierarchical_link_bound_s"] == pytest.approx(c["size_bytes"] * 8 / 100e6)


_ON_CPU = (
    "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[2:])"
)


def test_nodes_sharing_a_run_dir_bind_by_their_own_plans(tmp_path: Path) -> None:
    """Two nodes of a trainer job write one run dir (a shared filesystem): each node's ranks
    get the CPUs of their own node's plan, and the run dir keeps both plans."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: one per node")
    port = free_port()
    run = tmp_path / "run"
    base = [
        "-m",
        "numarun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--binding",
        "none",
        "-m",
        "numarun.train",
        "parallel=ddp",
        "trainer.steps=1",
        "trainer.batch_size=2",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
    ]
    cmds = [
        [sys.executable, "-c", _ON_CPU, str(cpus[i]), *base[:1], *base[1:2], "--node-rank", str(i), *base[2:]]
        for i in range(2)
    ]
    results = _run_nodes(cmds, tmp_path)
    for i, r in enumerate(results):
        assert r.returncode == 0, r.stdout[-4000:]
        assert f": gpu - cpus {cpus[i]} " in r.stdout, r.stdout[-4000:]  # the rank's binding line, read back
        plan = json.loads((run / f"numarun_plan.node{i}.json").read_text())
        assert [rank["cpus"] for rank in plan["ranks"]] == [[cpus[i]]]
