#!/usr/bin/env python3
"""What the step report (on by default, docs/steps.md) costs: a rank's step, and the agent.

    .venv/bin/python scripts/bench_steps.py [--runs 5] [--steps 300] [--per-rank] [--json FILE]

1. **The recorder's hooks, in this process**: a step made of a DataLoader batch, a collective and an optimizer step
   (each a no-op) and the backward of a small 4-layer model (whose parameters carry the gradient hooks and the two
   autograd callbacks that measure DDP's wait), with the recorder's hooks around them and its record written to a
   file, against the same step bare; the difference is what the recorder adds to every step, in microseconds.
2. **A training step side by side**: two ranks under numarun, each step a DataLoader batch, a DDP forward and
   backward of a 2-layer 512-wide MLP (its gradient all-reduce inside backward), an SGD step and the loss all-reduced
   (gloo), with ``--step-report on`` and ``off``, alternated ``--runs`` times; each rank times its own steps, wall
   and CPU (median after the first fifth). Prints both medians and the median of the runs' on/off ratios, pair by
   pair: on a shared host the load drifts between runs, the pairs cancel it; the CPU time a step takes is what the
   recorder adds to, and moves less with the load than the wall time.
   ``--per-rank``: the same two ranks started by Open MPI's ``mpirun -np 2 numarun`` (per-rank mode: each task its
   own rank, the node's agent a sidecar beside them) instead of torchrun's agent.
3. **The agent's look** at the ranks (every ``NUMARUN_STEP_INTERVAL``, default 5 s): one sample of the kernel's
   figures for two ranks (this process and its parent stand in for them), as a share of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_STEP_RANK = """
import json, os, statistics, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(4096, 512))
loader = torch.utils.data.DataLoader(data, batch_size=32)
steps, times, cpu = int(sys.argv[2]), [], []
while len(times) < steps:
    for (x,) in loader:
        t, c = time.perf_counter(), time.process_time()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if len(times) == steps:
            break
rank = dist.get_rank()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    skip = len(times) // 5
    json.dump({"step_s": statistics.median(times[skip:]), "cpu_s": statistics.median(cpu[skip:])}, f)
del model, opt
dist.destroy_process_group()
"""


def _hooks_us(steps: int = 20_000) -> tuple[float, float]:
    """(us per bare step, us per step with the recorder's hooks and its record written)."""
    from numarun.worker import phases, progress

    def noop(*args: object) -> None:
        return None

    class Opt:
        pass

    import torch

    class Ddp:
        """What the DDP wait's hooks read of a DDP module: its parameters and whether this backward syncs."""

        def __init__(self) -> None:
            self.module = torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(4)))
            self.require_backward_grad_sync = True

    torch.set_num_threads(1)
    opt = Opt()
    best = {"bare": float("inf"), "hooked": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        out = open(Path(tmp) / "steps.0.jsonl", "w", buffering=1 << 16)  # noqa: SIM115
        rec = phases.Recorder(out, rank=0, counters=progress.Counters(), flush_s=0.5, main=threading.get_ident())
        bare_model, hooked_model = Ddp(), Ddp()
        rec.ddp.attach(hooked_model)
        x = torch.randn(8, 16)
        models = {"bare": bare_model.module, "hooked": hooked_model.module}
        hooked = {"next": rec.timed(noop), "collective": rec.counters.wrap("all_reduce", noop)}
        for _ in range(5):
            for name in ("bare", "hooked"):
                fns = hooked if name == "hooked" else {"next": noop, "collective": noop}
                model = models[name]
                start = time.perf_counter()
                for _ in range(steps):
                    fns["next"]()
                    model(x).sum().backward()
                    fns["collective"]()
                    if name == "hooked":
                        rec.before_step(opt, (), {})
                        rec.after_step(opt, (), {})
                best[name] = min(best[name], (time.perf_counter() - start) / steps * 1e6)
        rec.finish()
        out.close()
    return best["bare"], best["hooked"]


def _sample_ms(rounds: int = 20) -> float:
    """ms of one look of the agent at two ranks (this process and its parent)."""
    from numarun.launch.steps.evidence import RankProc, Sampler

    cpus = frozenset(os.sched_getaffinity(0))
    ranks = [RankProc(0, os.getpid(), cpus, 0), RankProc(1, os.getppid(), cpus, 0)]
    sampler = Sampler()
    sampler.sample(ranks, time.monotonic())
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        sampler.sample(ranks, time.monotonic(), suspects={0})
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each setting, alternated (default 5)")
    ap.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--per-rank", action="store_true", help="start the ranks with mpirun (per-rank mode)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    numarun = [str(Path(sys.executable).parent / "numarun")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_"))}
    bare, hooked = _hooks_us()
    step: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="numarun-bench-") as tmp:
        script = Path(tmp) / "step.py"
        script.write_text(_STEP_RANK)
        for i in range(args.runs):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                out = Path(tmp) / f"{name}{i}"
                out.mkdir()
                if args.per_rank:
                    mpi = ["mpirun.openmpi", "-np", "2", "--oversubscribe", "--bind-to", "none"]
                    cmd = [*mpi, *numarun, "--step-report", name]
                    launch_env = {**env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
                else:
                    cmd = [*numarun, "--nproc-per-node", "2", "--standalone", "--step-report", name]
                    launch_env = env
                r = subprocess.run(
                    [*cmd, str(script), str(out), str(args.steps)],
                    env={**launch_env, "TMPDIR": tmp},
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                )
                if r.returncode != 0:
                    sys.stderr.write(r.stderr[-3000:])
                    return 1
                ranks = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
                step[name].append(statistics.mean(x["step_s"] for x in ranks))
                cpu[name].append(statistics.mean(x["cpu_s"] for x in ranks))
    sample = _sample_ms()
    med = {n: statistics.median(v) for n, v in step.items()}
    pairs = [on / off for on, off in zip(step["on"], step["off"], strict=True)]
    cpu_pairs = [on / off for on, off in zip(cpu["on"], cpu["off"], strict=True)]
    print(f"the recorder's hooks and record: +{hooked - bare:.1f} us a step ({bare:.2f} us bare, {hooked:.2f} hooked)")
    started = "mpirun (per-rank mode)" if args.per_rank else "numarun's torchrun agent"
    print(
        f"2 ranks started by {started}, DDP step (batch 32 of a 512x512 2-layer MLP, gloo), {args.steps} steps, "
        f"{args.runs} alternated runs (each run: the ranks' median step after the first fifth):"
    )
    for n in ("off", "on"):
        print(
            f"  step report {n:3s}: wall {med[n] * 1e3:.3f} ms a step (runs {min(step[n]) * 1e3:.3f} to "
            f"{max(step[n]) * 1e3:.3f}), CPU {statistics.median(cpu[n]) * 1e3:.3f} ms a step"
        )
    print(
        f"  on / off, the median of the {args.runs} run pairs: wall {statistics.median(pairs):.3f} (pairs "
        f"{min(pairs):.3f} to {max(pairs):.3f}), CPU {statistics.median(cpu_pairs):.3f} (pairs {min(cpu_pairs):.3f} "
        f"to {max(cpu_pairs):.3f})"
    )
    print(
        f"  the hooks' {hooked - bare:.1f} us are {(hooked - bare) * 1e-6 / med['off']:.3%} of this step; "
        f"the agent's look at 2 ranks: {sample:.2f} ms, {sample / 1e3 / 5:.3%} of a core every 5 s"
    )
    print(f"  load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"hooks_us": [bare, hooked], "step_s": step, "cpu_s": cpu, "sample_ms": sample}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
