"""``numarun tune``: measure the plan options (and Hydra override lists) on your own job and keep the fastest.

    numarun tune [--binding exclusive,node,none] [--mem-policy bind,preferred] [--omp plan,4,8]
                 [--trials K] [--json] [--json-file FILE] [--save PLAN.json] [--svg FILE] SCRIPT|-m MODULE [args...]

Runs the job once per candidate, alternated over K rounds (every round runs each candidate
once, rotated), each with ``numarun run --standalone``. Throughput: the trainer's
``metrics.jsonl``, else ``numarun.report(samples=N)``, else wall time. Prints a table
(median, range, peak memory, ratio to the default); ``--save`` writes the winner's plan
for ``numarun --plan-file``. Exit 2 for bad input, 1 when a candidate's run fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from .. import argtypes, envvars
from ..errors import TuneRunFailed, UsageError
from ..fsutil import write_output
from ..launch.child import numarun_command
from ..options.launch import LaunchOptions, Source, add_options, from_args, from_environ, given, option
from ..tune import candidates as cand
from ..tune.measure import Measured, from_metrics, from_reports
from ..tune.schedule import alternate
from ..tune.stats import Run, best, summarize, table, to_json

_trials = argtypes.int_in("--trials", low=1, high=argtypes.MAX_COUNT)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "tune",
        help="measure binding/memory/OMP choices (and Hydra override lists) on your job; keep the fastest",
        description="Run a short job once per candidate setting, alternated over --trials rounds, and report "
        "each candidate's median throughput (metrics.jsonl, numarun.report(samples=N), else wall time).",
    )
    # numarun run's --binding and --mem-policy, each a list of values to try
    parser.add_argument(
        *option("binding").flags,
        dest="binding",
        type=argtypes.typed("--binding", lambda text, _: cand.binding_axis(text)),
        default=None,
        metavar="LIST",
        help="binding modes to try, e.g. exclusive,node,none",
    )
    parser.add_argument(
        *option("mem_policy").flags,
        dest="mem_policy",
        type=argtypes.typed("--mem-policy", lambda text, _: cand.mem_policy_axis(text)),
        default=None,
        metavar="LIST",
        help="memory policies to try, e.g. bind,preferred",
    )
    parser.add_argument(
        "--omp",
        type=argtypes.typed("--omp", lambda text, _: cand.omp_axis(text)),
        default=None,
        metavar="LIST",
        help="OMP_NUM_THREADS values to try, e.g. plan,4,8 ('plan' = the plan's own)",
    )
    parser.add_argument(
        "--trials", type=_trials, default=3, metavar="K", help="rounds; each runs every candidate once (default 3)"
    )
    argtypes.add_json_options(parser, what="the results", script_follows=True)
    parser.add_argument(
        "--save", metavar="PLAN.json", default=None, help="write the winner's plan, for 'numarun --plan-file'"
    )
    parser.add_argument("--svg", metavar="FILE", default=None, help="write a bar chart of the results")
    parser.add_argument(
        "--work-dir", metavar="DIR", help="keep each run's log and run dir here (default: a temporary dir, removed)"
    )
    add_options(parser, ("nproc_per_node", "topology"), group=parser.add_argument_group("every run's (numarun run's)"))
    parser.add_argument("-m", "--module", action="store_true", help="SCRIPT is a module, as with python -m")
    parser.add_argument("script", metavar="SCRIPT", help="the training script (or module with -m)")
    parser.add_argument(
        "script_args",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="its arguments; key=a,b,c lists are swept for Hydra jobs",
    )
    parser.set_defaults(func=main)
    return parser


def _axes(args: argparse.Namespace) -> tuple[list[cand.Axis], list[str], str]:
    """(axes, the script's other args, app kind) from the parsed options."""
    from ..config.detect import detect_app

    kind = detect_app(args.script, is_module=args.module).name
    axes = [a for a in (args.binding, args.mem_policy, args.omp) if a is not None]
    rest = list(args.script_args)
    if kind != "PLAIN":
        override, rest = cand.override_axes(rest)
        axes += override
    if not axes:
        raise UsageError(
            "bad numarun tune: nothing to compare; expected --binding, --mem-policy, --omp lists "
            "(or key=a,b,c overrides for a Hydra job)"
        )
    return axes, rest, kind


def _command(
    args: argparse.Namespace, options: LaunchOptions, c: cand.Candidate, rest: list[str], run_dir: Path | None
) -> list[str]:
    # given here or in the environment (which the runs do not see: PET_* is left out), the same for every run
    cmd = numarun_command("run", "--standalone", *options.flags(Source.COMMAND_LINE, Source.ENVIRONMENT))
    for flag in ("binding", "mem-policy"):
        if c.get(flag) is not None:
            cmd += [f"--{flag}", str(c.get(flag))]
    if args.module:
        cmd.append("-m")
    cmd.append(args.script)
    cmd += c.overrides() + rest
    if run_dir is not None:
        cmd.append(f"hydra.run.dir={run_dir}")
    return cmd


def _run_once(cmd: list[str], env: dict[str, str], log_path: Path) -> tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS MiB of the largest process in the tree)."""
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024


def _measure(run_dir: Path | None, report_file: Path) -> Measured | None:
    if run_dir is not None and (run_dir / "metrics.jsonl").exists():
        m = from_metrics((run_dir / "metrics.jsonl").read_text())
        if m is not None:
            return m
    if report_file.exists():
        return from_reports(report_file.read_text())
    return None


def _baseline(environ: Mapping[str, str]) -> LaunchOptions:
    """What each run takes for the plan axes it is not given: the environment's, else numarun's defaults."""
    return from_environ(("binding", "mem_policy", "nic_policy"), environ)


def _save_plan(options: LaunchOptions, base: LaunchOptions, winner: cand.Candidate) -> str:
    from ..launch.planning import Planner
    from ..plan.model import BindingMode, MemPolicy

    plan = (
        Planner()
        .plan(
            given(
                topology=options.topology,
                nproc_per_node=options.nproc_per_node,
                nic_policy=base.nic_policy,
                binding=BindingMode(winner.get("binding") or base.binding),
                mem_policy=MemPolicy(winner.get("mem-policy") or base.mem_policy),
            )
        )
        .plan
    )
    omp = winner.get("omp")
    if omp and omp != cand.OMP_FROM_PLAN:
        ranks = tuple(dataclasses.replace(r, env={**r.env, "OMP_NUM_THREADS": omp}) for r in plan.ranks)
        plan = dataclasses.replace(plan, ranks=ranks)
    return plan.to_json()


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse an unwritable --json-file/--save/--svg before minutes of runs, not after."""
    for dest in ("json_file", "save", "svg"):
        value = getattr(args, dest)
        if value is not None and (Path(value).is_dir() or not Path(value).parent.is_dir()):
            flag = "--" + dest.replace("_", "-")
            raise UsageError(f"bad {flag} {value!r}: expected a file path in an existing directory")


def main(args: argparse.Namespace) -> int:
    if args.json and not args.module and args.script.endswith(".json"):  # --json FILE SCRIPT, the old spelling
        raise UsageError(argtypes.json_moved(args.script))
    if not args.module and not Path(args.script).is_file():
        raise UsageError(f"bad script {args.script!r}: no such file; expected a path to a Python script (or -m MODULE)")
    _check_outputs(args)
    options = from_args(args, os.environ).shown()
    axes, rest, kind = _axes(args)
    cands = cand.candidates(axes)
    base = _baseline(os.environ)
    default = cand.default_index(cands, axes, {"binding": base.binding.value, "mem-policy": base.mem_policy.value})
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="numarun-tune-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"bad --work-dir {args.work_dir!r}: {e.strerror}; expected a writable directory") from None
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    runs: list[list[Run]] = [[] for _ in cands]
    order = alternate(len(cands), args.trials)
    try:
        for n, (rnd, i) in enumerate(order, start=1):
            c = cands[i]
            tag = f"c{i}-r{rnd}"
            run_dir = work / tag if kind != "PLAIN" else None
            report_file = work / f"{tag}.report.jsonl"
            env = {**base_env, envvars.REPORT: str(report_file)}
            omp = c.get("omp")
            if omp and omp != cand.OMP_FROM_PLAN:
                env["OMP_NUM_THREADS"] = omp  # a value the user set wins over the plan's
            cmd = _command(args, options, c, rest, run_dir)
            code, wall, rss = _run_once(cmd, env, work / f"{tag}.log")
            if code != 0:
                tail = (work / f"{tag}.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
                where = f"log {work / (tag + '.log')}" if args.work_dir else "rerun with --work-dir to keep its log"
                raise TuneRunFailed(f"candidate {c.label()!r} failed with exit code {code} ({where}): {tail[0][:300]}")
            m = _measure(run_dir, report_file)
            runs[i].append(
                Run(
                    seconds=wall,
                    throughput=m.throughput if m else None,
                    unit=m.unit if m else "s",
                    peak_mem_mb=(m.peak_mem_mb if m and m.peak_mem_mb is not None else rss),
                )
            )
            said = f"{m.throughput:.4g} {m.unit}" if m and m.throughput is not None else "no throughput reported"
            print(f"run {n}/{len(order)}  {c.label()}: {wall:.2f} s, {said}", file=sys.stderr, flush=True)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    units = {r.unit for rs in runs for r in rs}
    if len(units) > 1:  # e.g. one candidate's runs reported and another's did not: compare times only
        runs = [[dataclasses.replace(r, throughput=None, unit="s") for r in rs] for rs in runs]
    summaries = summarize(cands, runs, default)
    winner = best(summaries)
    results = json.dumps(to_json(summaries, default=default, winner=winner, trials=args.trials), indent=1) + "\n"
    if args.json:
        sys.stdout.write(results)
    else:
        sys.stdout.write(table(summaries, default=default, winner=winner, color=sys.stdout.isatty()))
        ratio = f"{summaries[winner].ratio:.3f}x the default, {args.trials} alternated rounds"
        print(f"best: {cands[winner].label()} ({ratio})")
    if args.json_file:
        write_output(args.json_file, results, flag="--json-file")
    if args.svg:
        from ..tune.chart import render_chart

        write_output(args.svg, render_chart(summaries, default=default, winner=winner), flag="--svg")
    if args.save:
        write_output(args.save, _save_plan(options, base, cands[winner]), flag="--save")
        overrides = cands[winner].overrides()
        if overrides:
            print(f"the plan holds no Hydra overrides: pass {' '.join(overrides)} to the job yourself", file=sys.stderr)
    return 0
