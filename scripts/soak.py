"""Soak: the reference trainer under ``--max-restarts``, its workers killed with SIGKILL at random steps.

    .venv/bin/python scripts/soak.py                      # 200 steps, a checkpoint every 10, 5 faults
    .venv/bin/python scripts/soak.py --steps 30 --interval 5 --faults 2 --seed 1   # the suite's short one
    .venv/bin/python scripts/soak.py --layout all --binding node   # every layout of LAYOUTS, one after the other

Runs ``numarun --nproc-per-node N --max-restarts R scripts/train.py`` twice with the same
config (``trainer.resume=true``, a checkpoint every ``--interval`` steps): once untouched, as the
reference, and once with a worker chosen at random SIGKILLed when rank 0 has logged each of
``--faults`` steps drawn at random (``--seed``). ``--layout`` names the parallel layout (the
trainer's degrees, :data:`LAYOUTS`: replicas, shards, pipeline stages, tensor parallelism, HSDP
and their products, on 2 or 4 ranks); several (``pp,tp``, or ``all``) are soaked in turn, each
with its own reference and its own fault steps. Then checks, for each layout, and prints as figures:

* the final loss, and the loss of every step logged by any attempt, equal the reference's
  (batches and dropout seeds are functions of the step, so a resumed run retraces it);
* no process of the job is left: every process that inherited the run's marker variable is
  gone, after a grace of 30 s for torchrun's last reaping;
* no ``.step_*.tmp`` (or ``.old``) is left in the checkpoint dir;
* every restart is named in the log: numarun's ``restart k of R`` line for each fault, and
  one torchrun failure line for each (naming the killed pid, or a peer that failed first);
* every restart resumed from the newest complete checkpoint at its kill (or the next one, when
  that save completed as the kill landed), read from rank 0's ``resumed from ... (step N)``;
* the run trained on the layout asked for (``summary.json``'s ``layout``, the reference's);
* faults injected, restarts, steps redone (steps logged twice), and the seconds lost per
  fault (the soak's wall time less the reference's, over the faults).

Exit code 0 when every check of every layout holds, 1 otherwise (the failed checks are named). The last
line of each layout is ``SOAK layout=... ...`` with its figures; ``--json-file FILE`` writes them too (one object per
layout under ``layouts``, and every failed check, named with its layout, under ``failed_checks``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "scripts" / "train.py"
MARKER = "SOAK_JOB_ID"  # not NUMARUN_*: numarun reads those

LAYOUTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "ddp": (2, ()),  # the trainer's default preset: replicas
    "fsdp": (2, ("parallel=fsdp",)),
    "pp": (2, ("parallel=fsdp", "parallel.pp=2")),
    "tp": (2, ("parallel=tp",)),
    "hsdp": (4, ("parallel=fsdp", "parallel.dp_replicate=2", "parallel.dp_shard=2")),
    "pp-tp": (4, ("parallel=fsdp", "parallel.pp=2", "parallel.tp=2")),
    "pp-fsdp": (4, ("parallel=fsdp", "parallel.pp=2", "parallel.dp_shard=2")),
}
"""Layout name -> (ranks, the trainer's overrides that make it)."""


def _numarun() -> list[str]:
    exe = Path(sys.executable).parent / "numarun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "numarun"]


def _env(marker: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NUMARUN_", "PET_", "TORCHELASTIC_", "SLURM_")) and k not in ("OMP_NUM_THREADS",)
    }
    env.update(PYTHONUNBUFFERED="1", **{MARKER: marker})
    return env


def _rows(metrics: Path) -> list[dict[str, Any]]:
    """The logged steps, in order; a line torn by a kill is left out."""
    rows = []
    try:
        text = metrics.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def _workers(pid: int) -> list[psutil.Process]:
    """The job's training processes: numarun's children that torchrun gave a LOCAL_RANK."""
    out = []
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    for c in children:
        try:
            if "LOCAL_RANK" in c.environ():
                out.append(c)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(out, key=lambda c: c.pid)


def _marked(marker: str) -> list[int]:
    """Live processes (zombies count as gone) that inherited this run's marker variable."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == marker:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _left(marker: str) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _marked(marker):
        time.sleep(0.1)
    return _marked(marker)


def _newest(ckpt: Path) -> int:
    """The step of the newest complete checkpoint (a ``step_*`` with its meta.json), 0 when none."""
    steps = [int(p.parent.name.removeprefix("step_")) for p in ckpt.glob("step_*/meta.json")]
    return max(steps, default=0)


def _resumes(log: str, restarts: int) -> list[int]:
    """The step each restart resumed from (0: from the start), read from the log: rank 0's ``resumed from ...
    (step N)`` after numarun's ``restart k of R`` line."""
    parts = re.split(r"^numarun: WARNING: restart \d+ of \d+ \(--max-restarts\).*$", log, flags=re.M)[1:]
    found = [re.search(r"^resumed from \S+ \(step (\d+)\)", part, re.M) for part in parts[:restarts]]
    return [int(m.group(1)) if m else 0 for m in found]


def run(
    base: Path, name: str, args: argparse.Namespace, layout: str, targets: list[int], rng: random.Random
) -> dict[str, Any]:
    """One trainer run under numarun on ``layout``; SIGKILLs a random worker once rank 0 has logged each target
    step."""
    work = base / layout / name
    work.mkdir(parents=True)
    ckpt, run_dir, log_path = work / "ck", work / "run", work / "log"
    marker = f"{name}-{uuid.uuid4().hex}"
    nproc, degrees = LAYOUTS[layout]
    cmd = [
        *_numarun(),
        "--nproc-per-node",
        str(args.nproc or nproc),
        "--max-restarts",
        str(args.max_restarts),
        *(["--binding", args.binding] if args.binding else []),
        str(TRAIN),
        *degrees,
        f"trainer.steps={args.steps}",
        f"trainer.checkpoint_interval={args.interval}",
        "trainer.resume=true",
        "trainer.progress=false",
        f"trainer.checkpoint_dir={ckpt}",
        f"hydra.run.dir={run_dir}",
        *args.overrides,
    ]
    faults: list[dict[str, Any]] = []
    pending = list(targets)
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=_env(marker), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        hung = False
        try:
            seen, old_pids = 0, set()  # old_pids: the workers of the attempt last killed
            while proc.poll() is None:
                if time.monotonic() - t0 > args.hang_s:
                    hung = True
                    break
                time.sleep(0.005)
                if not pending:
                    continue
                workers = _workers(proc.pid)
                if not workers or old_pids & {w.pid for w in workers}:
                    continue  # no workers yet, or the killed attempt's still going down
                if old_pids:  # the restarted attempt: only what it logs counts from now on
                    seen, old_pids = len(_rows(run_dir / "metrics.jsonl")), set()
                    continue
                rows = _rows(run_dir / "metrics.jsonl")
                if len(rows) <= seen or rows[-1]["step"] < pending[0]:
                    continue
                victim = rng.choice(workers)
                newest = _newest(ckpt)
                try:
                    local_rank = int(victim.environ().get("LOCAL_RANK", "-1"))
                    os.kill(victim.pid, signal.SIGKILL)
                except (psutil.NoSuchProcess, ProcessLookupError):
                    continue
                faults.append(
                    {
                        "target": pending.pop(0),
                        "step": rows[-1]["step"],
                        "local_rank": local_rank,
                        "pid": victim.pid,
                        "newest": newest,
                        "at_s": round(time.monotonic() - t0, 2),
                    }
                )
                old_pids = {w.pid for w in workers}
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - t0
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {
        "code": proc.returncode,
        "hung": hung,
        "wall_s": wall,
        "faults": faults,
        "missed": pending,
        "rows": _rows(run_dir / "metrics.jsonl"),
        "summary": summary,
        "log": log_path.read_text(errors="replace"),
        "left": _left(marker),
        "stale": sorted(p.name for p in ckpt.glob(".step_*")) if ckpt.is_dir() else [],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--interval", type=int, default=10, help="steps between checkpoints (default 10)")
    p.add_argument("--faults", type=int, default=5, help="workers to SIGKILL (default 5)")
    p.add_argument("--max-restarts", type=int, default=5)
    p.add_argument(
        "--layout",
        default="ddp",
        metavar="NAME[,NAME...]",
        help=f"the parallel layouts to soak, in turn: {', '.join(LAYOUTS)}, or all (default ddp)",
    )
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: the layout's, 2 or 4)")
    p.add_argument("--binding", default=None, help="numarun's --binding (default: numarun's own)")
    p.add_argument("--seed", type=int, default=0, help="draws the fault steps and the workers killed")
    p.add_argument(
        "--hang-s",
        type=float,
        default=600,
        help="a run still going after this many seconds is ended and counts as hung (default 600)",
    )
    p.add_argument("--json-file", default=None, metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--keep", action="store_true", help="keep the run dirs (printed)")
    p.add_argument("overrides", nargs="*", help="more trainer overrides, e.g. model=gpt")
    args = p.parse_args()
    if not 0 < args.faults <= args.max_restarts or args.steps < 3 * args.interval or args.faults > args.steps // 3:
        p.error("expected 0 < --faults <= --max-restarts, --steps >= 3 * --interval, and --faults <= --steps / 3")
    layouts = list(LAYOUTS) if args.layout == "all" else args.layout.split(",")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or len(set(layouts)) != len(layouts):
        p.error(f"bad --layout {args.layout!r}: expected distinct names of {', '.join(LAYOUTS)}, or all")

    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="numarun-soak-"))
    figures: dict[str, dict[str, Any]] = {}
    try:
        for layout in layouts:
            # the last draw two intervals before the end: a kill seen late still lands before the run ends
            targets = sorted(rng.sample(range(2, args.steps - 2 * args.interval + 1), args.faults))
            ref = run(base, "reference", args, layout, [], rng)
            soak = run(base, "soak", args, layout, targets, rng)
            figures[layout] = report(args, layout, targets, ref, soak)
    finally:
        if args.keep:
            print(f"run dirs kept under {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    failed = [f"{layout}: {what}" for layout, f in figures.items() for what in f["failed_checks"]]
    if args.json_file:
        Path(args.json_file).write_text(json.dumps({"layouts": figures, "failed_checks": failed}, indent=1) + "\n")
    return 1 if failed else 0


def report(
    args: argparse.Namespace, layout: str, targets: list[int], ref: dict[str, Any], soak: dict[str, Any]
) -> dict[str, Any]:
    """Checks one layout's two runs; prints them and returns the layout's figures."""
    ref_loss = {r["step"]: r["loss"] for r in ref["rows"]}
    faults = soak["faults"]
    restart_lines = re.findall(r"^numarun: WARNING: restart (\d+) of (\d+) \(--max-restarts\)", soak["log"], re.M)
    failure_lines = [line for line in soak["log"].splitlines() if "failed (exitcode" in line]
    # torchrun names the first failed worker it sees: the killed one, or a peer whose collective
    # broke on the killed one's socket a moment earlier
    named = sum(1 for f in faults if any(f"(pid: {f['pid']})" in line for line in failure_lines))
    differ = sorted({r["step"] for r in soak["rows"] if ref_loss.get(r["step"]) != r["loss"]})
    steps_logged = len(soak["rows"])
    redone = steps_logged - len({r["step"] for r in soak["rows"]})
    lost = (soak["wall_s"] - ref["wall_s"]) / len(faults) if faults else 0.0
    final, ref_final = soak["summary"].get("final_loss"), ref["summary"].get("final_loss")
    # a restart loads the newest checkpoint at the kill, or the next one when its save ended as the kill landed
    resumed = _resumes(soak["log"], len(faults))
    newest = [f["newest"] for f in faults]
    spec = soak["summary"].get("layout")
    checks = {
        "reference run exited 0" + (f" (hung: ended after {args.hang_s:g} s)" if ref["hung"] else ""): ref["code"] == 0,
        "soak run exited 0" + (f" (hung: ended after {args.hang_s:g} s)" if soak["hung"] else ""): soak["code"] == 0,
        f"{args.faults} faults injected": len(faults) == args.faults,
        f"final loss equals the reference's ({final} vs {ref_final})": final is not None and final == ref_final,
        "every step's loss equals the reference's" + (f" (differs at {differ[:10]})" if differ else ""): not differ,
        f"ran to step {args.steps}": soak["summary"].get("steps_done") == args.steps,
        "no process left" + (f" (pids {soak['left'] + ref['left']})" if soak["left"] or ref["left"] else ""): not soak[
            "left"
        ]
        and not ref["left"],
        "no .tmp checkpoint left" + (f" ({soak['stale']})" if soak["stale"] else ""): not soak["stale"]
        and not ref["stale"],
        f"every restart named ({len(restart_lines)} restart lines, {len(faults)} faults)": [
            int(k) for k, _ in restart_lines
        ]
        == list(range(1, len(faults) + 1)),
        f"a failure line for every fault ({len(failure_lines)} lines, {len(faults)} faults; {named} name the killed"
        f" pid, the others a peer that failed first)": len(failure_lines) == len(faults),
        f"every restart resumed from the newest checkpoint (steps {resumed}, newest at the kills {newest})": len(
            resumed
        )
        == len(faults)
        and all(r in (n, n + args.interval) for r, n in zip(resumed, newest, strict=True)),
        f"trained on the layout asked for ({spec} as the reference's)": spec is not None
        and spec == ref["summary"].get("layout"),
    }
    nproc, degrees = LAYOUTS[layout]
    nproc = args.nproc or nproc
    print(
        f"soak: layout {layout} ({' '.join(degrees) or 'the default preset'}), {args.steps} steps, a checkpoint "
        f"every {args.interval}, {nproc} ranks, --max-restarts {args.max_restarts}, seed {args.seed}, fault steps "
        f"drawn {targets}"
    )
    for i, f in enumerate(faults, 1):
        print(
            f"  fault {i}: SIGKILL to local rank {f['local_rank']} (pid {f['pid']}) at step {f['step']} "
            f"(drawn {f['target']}), {f['at_s']:.1f} s into the run"
        )
    print(f"  layout {spec}, restarts resumed from steps {resumed}")
    print(f"  reference: {ref['wall_s']:.1f} s, final loss {ref_final}")
    print(f"  soak:      {soak['wall_s']:.1f} s, final loss {final}, {steps_logged} steps logged")
    for what, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    figures = {
        "layout": layout,
        "faults": len(faults),
        "restarts": len(restart_lines),
        "steps_redone": redone,
        "seconds_lost_per_fault": round(lost, 2),
        "reference_s": round(ref["wall_s"], 2),
        "soak_s": round(soak["wall_s"], 2),
        "final_loss": final,
        "reference_final_loss": ref_final,
        "processes_left": len(soak["left"]) + len(ref["left"]),
        "tmp_left": len(soak["stale"]) + len(ref["stale"]),
        "failed_checks": [w for w, ok in checks.items() if not ok],
        "fault_steps": [f["step"] for f in faults],
        "resumed_from": resumed,
        "layout_spec": spec,
    }
    if figures["failed_checks"] and not args.keep:
        for name, r in (("reference", ref), ("soak", soak)):
            sys.stdout.write(f"--- {name} log (last 3000 characters)\n{r['log'][-3000:]}\n")
    print(
        f"SOAK layout={layout} faults={figures['faults']} restarts={figures['restarts']} steps_redone={redone} "
        f"seconds_lost_per_fault={lost:.1f} final_loss_equal={'yes' if final == ref_final else 'no'} "
        f"processes_left={figures['processes_left']} tmp_left={figures['tmp_left']}"
    )
    return figures


if __name__ == "__main__":
    sys.exit(main())
