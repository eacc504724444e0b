#!/usr/bin/env python3
"""The step report's verdict, proved by repetition: every known-answer case and every balanced case run N times as
users run them, each verdict scored against the answer.

    .venv/bin/python scripts/verdicts.py [--runs 10] [--beside] [--only SUBSTRING] [--json FILE]

Every run is a real job started by numarun with its defaults (the step report on, its interval 5 s), two gloo ranks
on this host, under the loop users run: a plain DDP loop, FSDP2's fully_shard, Lightning's Trainer(strategy="ddp"),
accelerate's Accelerator, numarun's own trainer (``parallel=ddp`` and ``fsdp``). The job script is
tests/support/scripts/step_rank.py (each step 10 ms of CPU work a rank, one rank made slow):

* **balanced** (every rank alike): right when no rank is named;
* **input** (rank 1's dataset sleeps 30 ms a batch in its main thread): right when rank 1 is named with ``input``
  and the cause is its loading in the main thread;
* **compute** (rank 0's forward does 30 ms more work): right when rank 0 is named with ``compute``;
* **shared core** (``--binding exclusive``, a process spinning on rank 1's core from its first step on, at a
  higher priority than the job's): right when rank 1 is named and the cause names the spinner's pid;
* **two agents** (two numarun on this host, c10d on loopback, rank 3 of four slow in its input): right when rank 3
  is named, on the judging node only.

A verdict that names the wrong rank, phase or cause, or any rank of a balanced job, is **wrong**; one that names no
rank where there is one to name, or says it cannot judge, is **cannot tell** (honest, not right). ``--beside`` runs
every case while another numarun job (two balanced ranks, unbound) runs beside it on the same cores. The known-answer
jobs take 40 steps (about 10 s each, torch's start included): the short jobs users try first. The tally of the last
runs, with their date and machine: docs/measured.md, "The step report's verdict".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NUMARUN = [str(REPO / ".venv" / "bin" / "numarun")] if (REPO / ".venv" / "bin" / "numarun").exists() else ["numarun"]
JOB = REPO / "tests" / "support" / "scripts" / "step_rank.py"
TRAIN = REPO / "scripts" / "train.py"
SPIN = "while True: pass"
TIMEOUT_S = 300


@dataclass(frozen=True)
class Answer:
    """What a right verdict says: no rank (``rank`` None), or this rank, in this phase, for this cause."""

    rank: int | None = None
    phase: str = ""
    why: str = ""
    """A text the ``why:`` line must hold (``{spinner}`` stands for the spinner's pid)."""


@dataclass(frozen=True)
class Case:
    name: str
    answer: Answer
    run: Callable[[Path], Outcome]


@dataclass
class Outcome:
    verdict: str
    why: str = ""
    spinner: int = 0
    log: str = ""


@dataclass
class Tally:
    runs: int = 0
    right: int = 0
    cannot: int = 0
    wrong: int = 0
    wrong_verdicts: list[str] = field(default_factory=list)


def score(answer: Answer, out: Outcome) -> str:
    """``right``, ``cannot tell`` or ``wrong``."""
    named = re.match(r"=> rank (\d+)\b.* holds the job back: (\w+)", out.verdict)
    if answer.rank is None:
        if named:
            return "wrong"
        return "right" if out.verdict.startswith("=> no rank holds the job back") else "cannot tell"
    if not named:
        return "cannot tell"
    why = answer.why.replace("{spinner}", str(out.spinner))
    ok = int(named.group(1)) == answer.rank and named.group(2) == answer.phase and why in out.why
    return "right" if ok else "wrong"


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_", "MASTER_", "TORCHELASTIC_"))}
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    return {**env, "TMPDIR": str(tmp / "tmp"), "PYTHONUNBUFFERED": "1"}


def _verdict(log: str) -> tuple[str, str]:
    lines = [line[len("numarun: ") :] for line in log.splitlines() if line.startswith("numarun: ")]
    for i, line in enumerate(lines):
        if line.startswith("=> "):
            why = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("   why: ") else ""
            return line, why
    return "(no verdict)", ""


def _numarun(tmp: Path, *args: str, log: str = "log", env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*NUMARUN, "--log-level", "WARNING", *args],
        cwd=tmp,
        env=env or _env(tmp),
        stdout=open(tmp / log, "w"),  # noqa: SIM115  (the child holds it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(p: subprocess.Popen[bytes]) -> None:
    try:
        p.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def step_job(mode: str, slow: int, steps: int, wrap: str, *flags: str) -> Callable[[Path], Outcome]:
    def run(tmp: Path) -> Outcome:
        p = _numarun(
            tmp, "--nproc-per-node", "2", *flags, str(JOB), str(tmp / "out"), mode, str(slow), str(steps), wrap
        )
        _wait(p)
        log = (tmp / "log").read_text()
        return Outcome(*_verdict(log), log=log)

    return run


def trainer(parallel: str, steps: int) -> Callable[[Path], Outcome]:
    def run(tmp: Path) -> Outcome:
        args = (
            str(TRAIN),
            "launcher=cpu2",
            f"parallel={parallel}",
            "model=gpt",
            "trainer.batch_size=16",
            f"trainer.steps={steps}",
            "trainer.progress=false",
            f"hydra.run.dir={tmp / 'run'}",
        )
        p = _numarun(tmp, *args)
        _wait(p)
        log = (tmp / "log").read_text()
        return Outcome(*_verdict(log), log=log)

    return run


def _raise_priority(pid: int, nice: int) -> None:
    """As root: ``pid``'s session scheduled as a whole at ``nice`` (its autogroup) and ``pid`` itself."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def shared_core(wrap: str, steps: int) -> Callable[[Path], Outcome]:
    """The job with ``--binding exclusive``; from rank 1's first step on, a spinner on rank 1's core at a higher
    priority than the job's (the ranks wait at a gate until it spins)."""

    def run(tmp: Path) -> Outcome:
        plan = subprocess.run(
            [*NUMARUN, "plan", "--nproc-per-node", "2", "--binding", "exclusive", "--json"],
            env=_env(tmp),
            capture_output=True,
            text=True,
            check=True,
        )
        cpus = json.loads(plan.stdout)["ranks"][1]["cpus"]
        gate = tmp / "go"
        env = {**_env(tmp), "STEP_GATE": str(gate)}
        args = ("--nproc-per-node", "2", "--binding", "exclusive", str(JOB), str(tmp / "out"), "none", "0")
        p = _numarun(tmp, *args, str(steps), wrap, env=env)
        _raise_priority(p.pid, -10)
        spinner = None
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not (tmp / "out" / "started.1").exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            spinner = subprocess.Popen(
                ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-c", SPIN], start_new_session=True
            )
            _raise_priority(spinner.pid, -12)
            time.sleep(0.2)
            gate.touch()
            _wait(p)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        log = (tmp / "log").read_text()
        return Outcome(*_verdict(log), spinner=spinner.pid if spinner else 0, log=log)

    return run


def two_agents(steps: int) -> Callable[[Path], Outcome]:
    def run(tmp: Path) -> Outcome:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = ("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d")
        args += ("--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "verdicts")
        job = (str(JOB), str(tmp / "out"), "input", "3", str(steps), "fsdp")
        nodes = [_numarun(tmp, *args, *job, log=f"log{i}") for i in range(2)]
        for p in nodes:
            _wait(p)
        logs = [(tmp / f"log{i}").read_text() for i in range(2)]
        judged = [log for log in logs if "step report: " in log]
        if len(judged) != 1 or any("frame #" in log for log in logs):
            return Outcome("(not one judging node, or torch's C++ frames at the end)", log="\n".join(logs))
        return Outcome(*_verdict(judged[0]), log="\n".join(logs))

    return run


def cases() -> list[Case]:
    none = Answer()
    inp = Answer(1, "input", "it loads its batches in its main thread")
    comp = Answer(0, "compute")
    shared = Answer(1, "compute", "a shared core: pid {spinner} (")
    out = [
        Case(f"balanced, {w}", none, step_job("none", 0, 120, w)) for w in ("ddp", "fsdp", "lightning", "accelerate")
    ]
    out += [Case(f"balanced, trainer parallel={p}", none, trainer(p, 80)) for p in ("ddp", "fsdp")]
    out.append(Case("two agents, rank 3 slow (input), fsdp", Answer(3, "input"), two_agents(60)))
    for w in ("ddp", "fsdp", "lightning", "accelerate"):
        out.append(Case(f"input, {w}", inp, step_job("input", 1, 40, w)))
        out.append(Case(f"compute, {w}", comp, step_job("compute", 0, 40, w)))
        out.append(Case(f"shared core, {w}", shared, shared_core(w, 40)))
    return out


class Beside:
    """Another numarun job (two balanced ranks, unbound, until told to stop) on the same cores."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.p = _numarun(
            tmp, "--nproc-per-node", "2", "--binding", "none", str(JOB), str(tmp / "out"), "none", "0", "0", "fsdp"
        )

    def stop(self) -> None:
        (self.tmp / "out" / "stop").touch()
        _wait(self.p)


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        model = next(
            (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), ""
        )
    return f"{platform.node()}: {os.cpu_count()} CPUs ({model or platform.machine()}), Linux {platform.release()}"


def table(tallies: dict[str, Tally]) -> list[str]:
    width = max(len(n) for n in tallies)
    out = [f"{'case':<{width}}  runs  right  cannot tell  wrong", "-" * (width + 33)]
    for name, t in tallies.items():
        out.append(f"{name:<{width}}  {t.runs:>4}  {t.right:>5}  {t.cannot:>11}  {t.wrong:>5}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="runs of each case (default 10)")
    ap.add_argument("--beside", action="store_true", help="run every case beside another numarun job")
    ap.add_argument("--only", default="", help="the cases whose name holds this text")
    ap.add_argument("--json", type=Path, help="write the tally and every wrong verdict there")
    args = ap.parse_args(argv)
    chosen = [c for c in cases() if args.only in c.name]
    tallies = {c.name: Tally() for c in chosen}
    started = datetime.datetime.now(datetime.timezone.utc)
    work = Path(tempfile.mkdtemp(prefix="verdicts-"))
    beside = Beside(work / "beside") if args.beside else None
    try:
        for k in range(args.runs):  # each round runs every case once: a drifting load meets every case alike
            for case in chosen:
                tmp = work / f"{k}-{re.sub(r'[^a-z0-9]+', '-', case.name)}"
                outcome = case.run(tmp)
                result = score(case.answer, outcome)
                t = tallies[case.name]
                t.runs += 1
                t.right += result == "right"
                t.cannot += result == "cannot tell"
                t.wrong += result == "wrong"
                if result != "right":
                    t.wrong_verdicts.append(f"[{result}] {outcome.verdict} {outcome.why}".strip())
                print(f"round {k + 1}/{args.runs}  {case.name}: {result}: {outcome.verdict[:100]}", flush=True)
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if beside is not None:
            beside.stop()
    took = datetime.datetime.now(datetime.timezone.utc) - started
    print()
    print(
        f"{started:%Y-%m-%d}, {machine()}; {args.runs} runs a case{', beside another job' if args.beside else ''};"
        f" {took.total_seconds() / 60:.0f} min"
    )
    print("\n".join(table(tallies)))
    for name, t in tallies.items():
        for v in t.wrong_verdicts:
            print(f"  {name}: {v}")
    if args.json:
        args.json.write_text(json.dumps({n: t.__dict__ for n, t in tallies.items()}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if any(t.wrong for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
