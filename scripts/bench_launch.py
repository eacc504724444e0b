#!/usr/bin/env python3
"""Launch overhead of numarun vs torchrun: the same no-op script, alternated runs.

Each round runs both launchers once (the order flips every round so neither always
starts with a warm page cache) and times the whole command, from exec to exit. Prints
the median of each and the ratio numarun / torchrun (target <= 1.03), for wall time and
for the CPU time of the whole process tree (launcher + workers, from getrusage), which
stays meaningful on a busy machine where wall times swing by seconds.

    .venv/bin/python scripts/bench_launch.py [--runs 5] [--nproc-per-node 2] [--json-file FILE]

``--per-rank`` times per-rank mode instead: ``numarun script.py`` as one rank a scheduler started
(mpirun's variables for one rank), against ``python script.py``, alternated, for a script that
imports torch as training scripts do (and for an empty one, for scale); target <= 1.05.

``--mesh SPEC`` adds a third launcher to the alternation, ``numarun --mesh SPEC`` (e.g. ``dp_shard=-1``), and prints
its ratio to torchrun and to plain numarun: what declaring a layout adds to a launch (docs/layouts.md).

``--watchdog`` measures what the hang watchdog (on by default, docs/hangs.md) costs a rank, after the launch
overhead above (whose numarun runs have it on): the sampler thread's own CPU time per sample (read back from
each rank), a wrapped collective against the bare function (in this process), and a training-like step (a
matmul and a 1 MiB gloo all-reduce, 2 ranks) with the watchdog off, at its default (a sample every 5 s) and
with a sample every 0.5 s (``--hang-timeout 5``), alternated runs; the cost is stated as a share of a step and
of one core; target well under 1 %.

``--cli`` times the help screens instead (``numarun --help``, ``--version``, ``run --help``,
``tune --help``; median of --runs each), which must not import torch; ``--baseline CMD``
alternates them with another numarun command line (e.g. an older checkout's) for a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _tool(name: str, fallback: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / name
    return [str(exe)] if exe.exists() else fallback


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, float]:
    """(wall, cpu) seconds; cpu counts every waited-for descendant (the workers too)."""
    cpu0, start = _cpu_children(), time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"bench_launch: {' '.join(cmd)} failed with code {r.returncode}:\n{r.stderr[-2000:]}")
    return elapsed, _cpu_children() - cpu0


def _compile_numarun() -> None:
    """Byte-compile numarun's modules as ``pip install`` does for an installed wheel (torch's
    are): in an editable checkout run with PYTHONDONTWRITEBYTECODE=1 an edited module would
    otherwise be compiled again on every launch and counted as launch overhead."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("numarun")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            compileall.compile_dir(folder, quiet=1)


def _cli(args: argparse.Namespace) -> int:
    _compile_numarun()
    numarun = _tool("numarun", [sys.executable, "-m", "numarun"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_"))}
    # references on the same (possibly busy) host: a bare interpreter and one that imports torch
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        **{
            f"numarun {' '.join(c)}": [*numarun, *c]
            for c in (["--help"], ["--version"], ["run", "--help"], ["tune", "--help"])
        },
    }
    if args.baseline:
        import shlex

        base = shlex.split(args.baseline)
        cases.update({f"baseline {' '.join(c)}": [*base, *c] for c in (["--help"], ["--version"], ["run", "--help"])})
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):  # alternated: every round runs every case once
        for name, cmd in cases.items():
            times[name].append(_time(cmd, env, args.timeout)[0])
    for name, t in times.items():
        print(f"{name:26s} median {statistics.median(t):.3f} s (min {min(t):.3f}, max {max(t):.3f})")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps({"wall_s": times}, indent=1) + "\n")
    return 0


def _per_rank(args: argparse.Namespace) -> int:
    _compile_numarun()
    numarun = _tool("numarun", [sys.executable, "-m", "numarun"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_", "SLURM_", "OMPI_", "PMI"))}
    # one rank as mpirun starts it: per-rank mode, no agent, the script runs in numarun's interpreter
    env.update(
        OMPI_COMM_WORLD_RANK="0",
        OMPI_COMM_WORLD_SIZE="1",
        OMPI_COMM_WORLD_LOCAL_RANK="0",
        OMPI_COMM_WORLD_LOCAL_SIZE="1",
    )
    report: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="numarun-bench-") as tmp:
        scripts = {"imports torch": "import torch\n", "empty": "pass\n"}
        for label, text in scripts.items():
            script = Path(tmp) / f"{label.replace(' ', '_')}.py"
            script.write_text(text)
            cases = {"python script.py": [sys.executable, str(script)], "numarun script.py": [*numarun, str(script)]}
            times: dict[str, list[float]] = {name: [] for name in cases}
            cpu: dict[str, list[float]] = {name: [] for name in cases}
            _time(cases["python script.py"], env, args.timeout)  # warm-up, not counted
            for i in range(args.runs):
                for name in cases if i % 2 == 0 else reversed(list(cases)):
                    wall, used = _time(cases[name], env, args.timeout)
                    times[name].append(wall)
                    cpu[name].append(used)
            med = {n: statistics.median(t) for n, t in times.items()}
            med_cpu = {n: statistics.median(t) for n, t in cpu.items()}
            print(
                f"per-rank mode, script that {label if label != 'empty' else 'is empty'}, {args.runs} alternated runs:"
            )
            for n in cases:
                print(
                    f"  {n:18s} wall median {med[n]:.3f} s (min {min(times[n]):.3f}, max {max(times[n]):.3f})"
                    f"  cpu median {med_cpu[n]:.3f} s"
                )
            ratio = med["numarun script.py"] / med["python script.py"]
            ratio_cpu = med_cpu["numarun script.py"] / med_cpu["python script.py"]
            extra = med["numarun script.py"] - med["python script.py"]
            target = "  (target <= 1.05)" if label == "imports torch" else ""
            print(f"  ratio numarun/python wall {ratio:.3f}  cpu {ratio_cpu:.3f}  (+{extra * 1000:.0f} ms){target}")
            report[label] = {"wall_s": times, "cpu_s": cpu}  # type: ignore[dict-item]
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, indent=1) + "\n")
    return 0


_STEP_RANK = """
import json, os, statistics, sys, time
import torch
import torch.distributed as dist
from numarun.worker import progress

dist.init_process_group("gloo")
torch.manual_seed(0)
x, buf, times = torch.randn(256, 256), torch.randn(262144), []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    y = x @ x
    dist.all_reduce(buf)
    times.append(time.perf_counter() - t)
rank = dist.get_rank()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"step_s": statistics.median(times[len(times) // 5:]), **progress.figures()}, f)
dist.destroy_process_group()
"""


def _wrapper_ns(calls: int = 200_000) -> tuple[float, float]:
    """(ns per call of a bare no-op, ns per call of the same wrapped as the worker wraps collectives)."""
    import torch  # noqa: F401  (in a rank, torch is there: the wrapper asks torch.compiler whether it compiles)

    from numarun.worker.progress import Counters

    def noop(*args: object, **kwargs: object) -> None:
        return None

    wrapped = Counters().wrap("all_reduce", noop)
    best = {"bare": float("inf"), "wrapped": float("inf")}
    for _ in range(5):
        for name, fn in (("bare", noop), ("wrapped", wrapped)):
            start = time.perf_counter()
            for _ in range(calls):
                fn(1, op=2)
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e9)
    return best["bare"], best["wrapped"]


def _watchdog(args: argparse.Namespace, numarun: list[str], env: dict[str, str]) -> dict[str, object]:
    configs = {"off": "0", "default": "300", "0.5 s sample": "5"}
    step: dict[str, list[float]] = {name: [] for name in configs}
    samples: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="numarun-bench-") as tmp:
        script = Path(tmp) / "step.py"
        script.write_text(_STEP_RANK)
        for i in range(args.runs):
            for name in configs if i % 2 == 0 else reversed(list(configs)):
                out = Path(tmp) / f"{name}{i}".replace(" ", "_")
                out.mkdir()
                cmd = [
                    *numarun,
                    "--nproc-per-node",
                    "2",
                    "--standalone",
                    "--hang-timeout",
                    configs[name],
                    str(script),
                    str(out),
                    str(args.steps),
                ]
                _time(cmd, env, args.timeout)
                for rank in out.glob("rank*.json"):
                    r = json.loads(rank.read_text())
                    step[name].append(r["step_s"])
                    if r.get("samples"):
                        samples[name].append(r["sampler_cpu_s"] / r["samples"])
    bare, wrapped = _wrapper_ns()
    med = {n: statistics.median(t) for n, t in step.items()}
    per_sample = statistics.median([s for n in samples for s in samples[n]])
    sample_s = {"default": 5.0, "0.5 s sample": 0.5}
    print(
        f"hang watchdog, 2 ranks, step = 256x256 matmul + 1 MiB gloo all-reduce, {args.steps} steps, "
        f"{args.runs} alternated runs each:"
    )
    for n in configs:
        print(
            f"  watchdog {n:18s} step median {med[n] * 1e3:.3f} ms (min {min(step[n]) * 1e3:.3f}, "
            f"max {max(step[n]) * 1e3:.3f})  ratio to off {med[n] / med['off']:.3f}"
        )
    print(
        f"  sampler CPU per sample: {per_sample * 1e6:.0f} us: {per_sample / 5.0:.4%} of a core at the default "
        f"5 s sample, {per_sample / 0.5:.4%} at 0.5 s (--hang-timeout 5)"
    )
    print(
        f"  a counted collective: +{wrapped - bare:.0f} ns per call ({bare:.0f} ns bare, {wrapped:.0f} ns wrapped): "
        f"{(wrapped - bare) * 1e-9 / med['off']:.5%} of this step per collective"
    )
    return {"step_s": step, "sampler_cpu_per_sample_s": per_sample, "wrapper_ns": [bare, wrapped], "sample_s": sample_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each launcher (default 5)")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds before one launch counts as hung")
    parser.add_argument("--json-file", metavar="FILE", help="also write the timings as JSON to FILE")
    parser.add_argument("--cli", action="store_true", help="time numarun's help screens and --version instead")
    parser.add_argument(
        "--baseline", metavar="CMD", default=None, help="with --cli: also time this numarun command line"
    )
    parser.add_argument(
        "--mesh",
        metavar="SPEC",
        default=None,
        help="also time 'numarun --mesh SPEC' (a layout over the ranks, e.g. dp_shard=-1)",
    )
    parser.add_argument(
        "--per-rank",
        action="store_true",
        help="time per-rank mode (one rank a scheduler started) against python script.py",
    )
    parser.add_argument(
        "--watchdog", action="store_true", help="after the launch overhead, measure what the hang watchdog costs a rank"
    )
    parser.add_argument("--steps", type=int, default=400, help="with --watchdog: steps per run (default 400)")
    args = parser.parse_args()
    if args.cli:
        return _cli(args)
    if args.per_rank:
        return _per_rank(args)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_"))}
    _compile_numarun()
    with tempfile.TemporaryDirectory(prefix="numarun-bench-") as tmp:
        noop = Path(tmp) / "noop.py"
        noop.write_text("pass\n")
        launch = ["--nproc-per-node", str(args.nproc_per_node), "--standalone", str(noop)]
        numarun = _tool("numarun", [sys.executable, "-m", "numarun"])
        commands = {
            "numarun": [*numarun, *launch],
            "torchrun": [*_tool("torchrun", [sys.executable, "-m", "torch.distributed.run"]), *launch],
        }
        if args.mesh:
            commands["mesh"] = [*numarun, "--mesh", args.mesh, *launch]
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        order = list(commands)
        _time(commands["torchrun"], env, args.timeout)  # warm-up, not counted
        for i in range(args.runs):
            for name in order if i % 2 == 0 else reversed(order):
                wall, used = _time(commands[name], env, args.timeout)
                times[name].append(wall)
                cpu[name].append(used)
                print(f"run {i + 1} {name:8s} wall {wall:.3f} s cpu {used:.3f} s", file=sys.stderr, flush=True)

    med = {name: statistics.median(t) for name, t in times.items()}
    med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    ratio = med["numarun"] / med["torchrun"]
    ratio_cpu = med_cpu["numarun"] / med_cpu["torchrun"]
    mesh_ratios = {}
    print(f"no-op script, --nproc-per-node {args.nproc_per_node} --standalone, {args.runs} alternated runs each")
    for name in commands:
        print(
            f"{name:8s} wall median {med[name]:.3f} s (min {min(times[name]):.3f}, max {max(times[name]):.3f})"
            f"  cpu median {med_cpu[name]:.3f} s"
        )
    print(f"ratio numarun/torchrun wall {ratio:.3f}  cpu {ratio_cpu:.3f}  (target <= 1.03)")
    if "mesh" in med:
        mesh_ratios = {
            "mesh_vs_torchrun_wall": med["mesh"] / med["torchrun"],
            "mesh_vs_numarun_wall": med["mesh"] / med["numarun"],
            "mesh_vs_torchrun_cpu": med_cpu["mesh"] / med_cpu["torchrun"],
        }
        print(
            f"ratio numarun --mesh {args.mesh}/torchrun wall {mesh_ratios['mesh_vs_torchrun_wall']:.3f}  cpu "
            f"{mesh_ratios['mesh_vs_torchrun_cpu']:.3f}; /numarun wall {mesh_ratios['mesh_vs_numarun_wall']:.3f}"
        )
    watchdog = _watchdog(args, commands["numarun"][: -len(launch)], env) if args.watchdog else None
    if args.json_file:
        report = {
            "wall_s": times,
            "cpu_s": cpu,
            "median_wall_s": med,
            "median_cpu_s": med_cpu,
            "ratio_wall": ratio,
            "ratio_cpu": ratio_cpu,
            "watchdog": watchdog,
            **mesh_ratios,
        }
        Path(args.json_file).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
