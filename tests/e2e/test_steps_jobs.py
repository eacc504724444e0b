"""The step report on real gloo jobs started by numarun, each with a known answer (docs/steps.md): a rank slow in
its input (DDP) and one slow in its compute (FSDP2) are named with that phase, a rank whose core another process
spins on is named with that process's pid and command, a balanced four-rank job under load names none while
``numarun top --once`` shows every rank's step time, two agents (c10d on loopback) name the slow rank of the
second node once, on the judging node.

Every job runs tests/support/scripts/step_rank.py with ``NUMARUN_STEP_INTERVAL=0.5`` (the shared core's with the
default, 5 s, longer than its job: the kernel's figures from its first steps and its last look). Every wait is
bounded by :data:`helpers.TIMEOUT`; none is a performance bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest
from helpers import SCRIPTS, TIMEOUT, clean_env, free_port, listening, numarun_cmd, run_numarun, wait_until

from numarun.worker.steps import LiveTable, read_records

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "step_rank.py"
SPIN = "while True: pass"


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """The test's environment; ``NUMARUN_STEP_INTERVAL=""`` leaves numarun's default interval (5 s)."""
    (tmp / "tmp").mkdir(exist_ok=True)
    env = clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp"), **{"NUMARUN_STEP_INTERVAL": "0.5", **extra})
    return {k: v for k, v in env.items() if v != ""}


def _start(tmp: Path, *args: str, job: tuple[str, ...], log: str = "log", **env: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """``numarun ARGS step_rank.py OUT MODE SLOW STEPS WRAP`` (``job``) in a session of its own, output in
    ``tmp/log``."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    argv = [*numarun_cmd(), "--log-level", "WARNING", *args, str(SCRIPT), str(out), *job]
    return subprocess.Popen(
        argv,
        cwd=SCRIPTS,
        env=_env(tmp, **env),
        stdout=open(tmp / log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(p: subprocess.Popen) -> int:  # type: ignore[type-arg]
    try:
        return p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def _report(text: str) -> list[str]:
    """The step report's lines (``numarun: `` taken off), from its first line on."""
    lines = [line[len("numarun: ") :] for line in text.splitlines() if line.startswith("numarun: ")]
    start = next((i for i, line in enumerate(lines) if line.startswith("step report: ")), None)
    assert start is not None, text[-3000:]
    return lines[start:]


def _verdict(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("=> "))


def _files(lines: list[str]) -> Path:
    found = re.search(r": (\S+)/ \(steps\.jsonl, steps\.svg, steps\.trace\.json\)$", lines[-1])
    assert found, lines
    return Path(found.group(1))


def test_a_rank_slow_in_its_input_is_named_with_input_ddp(tmp_path: Path) -> None:
    """Rank 1's dataset sleeps 30 ms a batch in the main thread (no loader workers); DDP's gradient all-reduce, run
    in C++ inside backward, is where rank 0 waits. The summary, the verdict, the fix and the files."""
    code = _finish(_start(tmp_path, "--nproc-per-node", "2", job=("input", "1", "40", "ddp")))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    assert re.fullmatch(r"step report: 40 steps of 2 ranks, [\d.]+ steps/s, a step [\d.]+ m?s", lines[0]), lines
    assert lines[1].split()[:7] == ["share", "of", "a", "step", "rank", "1", "(slowest)"], lines
    verdict = _verdict(lines)
    assert verdict.startswith("=> rank 1 holds the job back: input, "), lines
    why = lines[lines.index(verdict) + 1]
    assert why.startswith("   why: it loads its batches in its main thread (DataLoader num_workers=0)"), lines
    assert lines[lines.index(verdict) + 2] == "   fix: more loader workers (DataLoader num_workers)", lines
    kept = _files(lines)
    assert kept.is_relative_to(tmp_path / "tmp") and (kept / "summary.txt").read_text().splitlines() == lines
    records = list(read_records((kept / "steps.jsonl").read_text().splitlines()))
    assert {r.rank for r in records} == {0, 1} and max(r.step for r in records) == 40
    waiting = [r for r in records if r.rank == 0 and r.step > 1]
    assert all(r.extra["ddp_wait_s"] > 0 for r in waiting)  # rank 0 waited inside DDP's backward, every step
    assert (
        sorted(r.comm_s for r in waiting)[len(waiting) // 2]
        > sorted(r.comm_s for r in records if r.rank == 1 and r.step > 1)[len(waiting) // 2]
    )
    svg = ElementTree.fromstring((kept / "steps.svg").read_text())
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and {"0", "1"} <= {
        g.get("data-rank") for g in svg.iter("{http://www.w3.org/2000/svg}g")
    }
    assert "traceEvents" in json.loads((kept / "steps.trace.json").read_text())
    assert "Traceback" not in log


def test_a_rank_slow_in_its_compute_is_named_with_compute_fsdp2(tmp_path: Path) -> None:
    """Rank 0's forward does 30 ms more CPU work than rank 1's; FSDP2's all-gathers and reduce-scatters (and
    their waits) are where rank 1 waits."""
    code = _finish(_start(tmp_path, "--nproc-per-node", "2", job=("compute", "0", "40", "fsdp")))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    verdict = _verdict(lines)
    assert verdict.startswith("=> rank 0 holds the job back: compute, "), lines
    comm = next(line.split() for line in lines if line.lstrip().startswith("comm "))
    assert int(comm[1]) < int(comm[3]), lines  # the slow rank waits least; the other's waits are FSDP2's


@pytest.mark.parametrize(
    "wrap, mode, slow, phase",
    [("lightning", "input", 1, "input"), ("accelerate", "compute", 0, "compute")],
)
def test_the_loops_users_run_lightning_and_accelerate(
    tmp_path: Path, wrap: str, mode: str, slow: int, phase: str
) -> None:
    """Lightning's Trainer(strategy="ddp") runs forward and backward inside the optimizer's step (a closure) and
    accelerate's Accelerator wraps the model in DDP: the slow rank is named with the phase it loses its time in,
    measured every step (DDP's wait exactly, the closure as compute)."""
    code = _finish(_start(tmp_path, "--nproc-per-node", "2", job=(mode, str(slow), "60", wrap)))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    assert _verdict(lines).startswith(f"=> rank {slow} holds the job back: {phase}, "), lines
    records = list(read_records((_files(lines) / "steps.jsonl").read_text().splitlines()))
    assert all(r.extra["ddp_wait_s"] > 0 for r in records if r.step > 1)  # DDP's wait, every step, on every rank
    assert "Traceback" not in log


def _cpus_of_rank(tmp: Path, local_rank: int) -> list[int]:
    r = run_numarun("plan", "--nproc-per-node", "2", "--binding", "exclusive", "--json", env=_env(tmp))
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout)["ranks"][local_rank]["cpus"])


def _raise_priority(pid: int, nice: int) -> None:
    """Where this test may (root): ``pid``'s session scheduled as a whole at ``nice`` (its autogroup: the kernel
    shares a CPU between sessions first, and a nice value counts only inside one) and ``pid`` itself at ``nice``."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def _cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` so far (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def test_a_rank_whose_core_another_process_spins_on_is_named_with_its_pid_and_command(tmp_path: Path) -> None:
    """``--binding exclusive``: each rank its own core; a spinner pinned to rank 1's core. The kernel moves other
    runnable work away from the spinner's core onto rank 0's: on a host busy with other sessions, rank 0 would be as
    slow as rank 1. So where the test may (root) the job's session runs at nice -10 and the spinner's at -12: the
    spinner takes most of rank 1's core, the other sessions little of rank 0's."""
    cpus = _cpus_of_rank(tmp_path, 1)
    gate = tmp_path / "go"
    p = _start(
        tmp_path,
        "--nproc-per-node",
        "2",
        "--binding",
        "exclusive",
        job=("none", "0", "20", "ddp"),
        STEP_GATE=str(gate),
        NUMARUN_STEP_INTERVAL="",  # the default, 5 s: the job is shorter than two intervals
    )
    _raise_priority(p.pid, -10)  # its ranks, started later, are of its session
    spinner = None
    try:
        # from rank 1's first step on: its start (importing torch on its one core) would crawl beside the spinner;
        # the ranks wait at the gate until the spinner spins
        wait_until("rank 1's first step", lambda: (tmp_path / "out" / "started.1").exists(), TIMEOUT, proc=p)
        spinner = subprocess.Popen(
            ["taskset", "-c", ",".join(map(str, cpus)), sys.executable, "-c", SPIN], start_new_session=True
        )
        _raise_priority(spinner.pid, -12)
        wait_until("the spinner spins", lambda: _cpu_ticks(spinner.pid) > 5, TIMEOUT)
        gate.touch()
        code = _finish(p)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    assert spinner is not None
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    verdict = _verdict(lines)
    assert verdict.startswith("=> rank 1 holds the job back: compute, "), lines
    why = lines[lines.index(verdict) + 1]
    assert why.startswith(f"   why: a shared core: pid {spinner.pid} (") and f"-c {SPIN}) ran " in why, lines
    assert f"(its cpus {','.join(map(str, cpus))})" in why
    fix = lines[lines.index(verdict) + 2]
    assert fix.startswith(f"   fix: free its cores: stop or move pid {spinner.pid}"), lines


def test_a_balanced_job_under_load_names_no_rank_and_numarun_top_shows_every_ranks_step_time(tmp_path: Path) -> None:
    """Four ranks alike on two cores, unbound, beside a spinner that takes a core's worth of time wherever the
    kernel puts it: no rank is named. While it runs, ``numarun top --once`` (the agent's live view, which numarun
    writes on its own) prints a row with a step time for each of the four ranks and a verdict line; the job is
    stopped after 40 steps more."""
    load = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        p = _start(tmp_path, "--nproc-per-node", "4", "--binding", "none", job=("none", "0", "0", "fsdp"))
        env = _env(tmp_path, COLUMNS="200")
        answers: list[str] = []

        def top() -> dict[int, list[str]] | None:
            r = subprocess.run(
                [*numarun_cmd(), "top", "--once", "--pid", str(p.pid)],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
            )
            answers[:] = [f"exit {r.returncode}: {r.stdout}{r.stderr}"]
            rows = _rows(r.stdout)
            verdict = any(line.startswith("=> ") for line in r.stdout.splitlines())
            return rows if r.returncode == 0 and verdict and sorted(rows) == [0, 1, 2, 3] else None

        def steps() -> int | None:
            """The fewest steps of a rank that ``numarun top`` shows, once every rank has a step time."""
            rows = top()
            paces = [_pace(cells) for cells in rows.values()] if rows else [None]
            return min(pace[0] for pace in paces if pace) if all(paces) else None

        first = wait_until("numarun top with every rank's step time", steps, TIMEOUT, proc=p)
        wait_until("40 steps more", lambda: (steps() or 0) >= first + 40, TIMEOUT, proc=p)
        (tmp_path / "out" / "stop").touch()
        code = _finish(p)
    finally:
        load.kill()
        load.wait()
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:] + "\n".join(answers)
    lines = _report(log)
    assert re.match(r"step report: \d+ steps of 4 ranks", lines[0]), lines
    assert _verdict(lines).startswith("=> no rank holds the job back"), lines


def _rows(text: str) -> dict[int, list[str]]:
    """``numarun top``'s rows by rank: lines whose first cell is a number and that have the table's width."""
    return {int(c[0]): c for line in text.splitlines() if (c := line.split()) and c[0].isdigit() and len(c) > 10}


def _pace(cells: list[str]) -> tuple[int, float] | None:
    """A row's (steps, step time) where it has a step time (``0.213 s``, ``21.3 ms``: the cells after the steps),
    else None."""
    for k in range(2, len(cells) - 1):
        if cells[k + 1] in ("s", "ms") and cells[k - 1].isdigit():
            try:
                step_s = float(cells[k])
            except ValueError:
                continue
            return (int(cells[k - 1]), step_s) if step_s > 0 else None
    return None


def test_two_agents_name_the_slow_rank_once_on_the_judging_node(tmp_path: Path) -> None:
    """Two agents on this host (c10d on loopback), two ranks each; rank 3, on the node of group rank 1, loads
    slowly. While it runs, each agent's live table holds every rank of the job; at the end the judging node prints
    the report on every node's last view, naming rank 3 and its node, the other says where its files are, and
    neither prints anything of torch's store (the agents leave it before its host does)."""
    port = free_port()
    args = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "steps",
    )
    nodes = [_start(tmp_path, *args, job=("input", "3", "60", "ddp"), log=f"log{i}") for i in range(2)]

    def every_rank_on_both_nodes() -> bool:
        """Each agent's live table (what numarun top shows there) holds all four ranks of the job."""
        tables = []
        for f in (tmp_path / "tmp").glob("numarun-*/steps.live.json"):
            try:
                tables.append(LiveTable.parse(f.read_text()))
            except (OSError, ValueError):
                return False
        return len(tables) == 2 and all([r.place.rank for r in t.rows if r.step_s] == [0, 1, 2, 3] for t in tables)

    try:
        wait_until("every rank in both agents' live tables", every_rank_on_both_nodes, TIMEOUT, proc=nodes[0])
    finally:
        codes = [_finish(p) for p in nodes]
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    judged = [text for text in logs if "step report: " in text]
    assert len(judged) == 1, logs
    lines = _report(judged[0])
    assert re.match(r"step report: \d+ steps of 4 ranks on 2 nodes", lines[0]), lines
    assert re.match(r"=> rank 3 \(node 1, [^)]+\) holds the job back: input, ", _verdict(lines)), lines
    other = next(text for text in logs if text is not judged[0])
    assert "=>" not in other and "step report of this node's ranks: " in other, other
    assert sum(text.count("holds the job back") for text in logs) == 1
    # the job succeeded: it ends as quietly as under torchrun, nothing of torch's store client in either log
    for text in logs:
        assert "frame #" not in text and "TCPStore" not in text and "failed to shutdown" not in text, text


def test_the_node_hosting_the_store_killed_leaves_the_other_one_line_and_nothing_of_torchs(tmp_path: Path) -> None:
    """Two agents on this host (c10d on loopback), two ranks each, the step report on; the node that hosts the store
    (the one started first) is SIGKILLed with its whole process group while the ranks step. The other ends with
    numarun's one error line naming its failed ranks, or saying a node was lost (whichever its agent sees first):
    its agent, its torchrun and torch's store client print nothing of their own (no C++ warning or frame, none of
    torch elastic's internal lines); its ranks' tracebacks, which are the user's, stay, and so does torch's one line
    per failed rank."""
    port = free_port()
    args = ("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}")
    host = _start(tmp_path, *args, "--rdzv-id", "lost", job=("none", "0", "0", "ddp"), log="log0")
    try:
        wait_until("the c10d store", lambda: listening(port), TIMEOUT, proc=host)
        other = _start(tmp_path, *args, "--rdzv-id", "lost", job=("none", "0", "0", "ddp"), log="log1")
        try:
            out = tmp_path / "out"
            wait_until(
                "every rank's first step", lambda: all((out / f"started.{r}").exists() for r in range(4)), TIMEOUT
            )
            os.killpg(host.pid, signal.SIGKILL)  # numarun and its agent; its ranks follow (parent-death signal)
            host.wait(timeout=TIMEOUT)
            code = _finish(other)
        finally:
            if other.poll() is None:
                os.killpg(other.pid, signal.SIGKILL)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
    log = (tmp_path / "log1").read_text()
    assert code != 0, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("numarun: error: ")]
    # which the agent sees first is a race: its ranks' failures (gloo's reset), or the store gone at its next look
    failed = r"numarun: error: rank [23] \(local rank [01], pid \d+\) "
    lost = r"numarun: error: rendezvous failed: .*\(a node was lost or the rendezvous endpoint '127\.0\.0\.1:\d+' "
    assert len(errors) == 1 and (re.match(failed, errors[0]) or re.match(lost, errors[0])), log
    ours = [line for line in log.splitlines() if not line.startswith("[rank")]  # the ranks' own lines are the user's
    theirs = [line for line in ours if not line.startswith("numarun: ")]
    assert all(re.search(r"elastic/multiprocessing/api\.py:\d+\] failed \(exitcode: ", line) for line in theirs), log
    for noise in ("frame #", "TCPStore", "error_handler.py", "dynamic_rendezvous", "closing signal", "WARNING: "):
        assert not any(noise in line for line in ours), (noise, log)


@contextlib.contextmanager
def _small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` for the block (root only: the test is skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem (tmpfs) needs root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path) -> None:
    """Fill the filesystem under ``where`` to the last byte."""
    with open(where / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def test_a_log_dir_that_fills_keeps_no_files_says_so_once_and_still_prints_the_summary(tmp_path: Path) -> None:
    """``--log-dir`` on a 1 MiB filesystem that fills while the two ranks step: the job's exit code is the job's
    (0), the summary is on stderr as ever, and one line names the file that could not be written and why; nothing
    half-written is left."""
    with _small_filesystem(tmp_path / "small", "1m") as small:
        p = _start(tmp_path, "--nproc-per-node", "2", "--log-dir", str(small), job=("none", "0", "0", "ddp"))
        try:
            wait_until("rank 1's first step", lambda: (tmp_path / "out" / "started.1").exists(), TIMEOUT, proc=p)
            _fill(small)
            (tmp_path / "out" / "stop").touch()
            code = _finish(p)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        left = sorted(path.name for path in small.iterdir() if path.name.startswith("numarun_"))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    assert re.match(r"step report: \d+ steps of 2 ranks", lines[0]) and _verdict(lines), lines
    said = [line for line in lines if "cannot write" in line]
    assert len(said) == 1 and said == [lines[-1]], lines
    assert re.fullmatch(
        rf"WARNING: the step report's files are not kept: cannot write {small}/numarun_steps\.[^/]+/steps\.jsonl: "
        "No space left on device",
        said[0],
    ), said
    assert left == [] and "Traceback" not in log


def test_a_job_that_never_steps_an_optimizer_has_no_report_and_keeps_no_files(tmp_path: Path) -> None:
    """Two DDP ranks whose update is made by hand (no torch.optim optimizer): no step is recorded, so no report is
    said and no file kept; the job's output and exit code are its own."""
    code = _finish(_start(tmp_path, "--nproc-per-node", "2", job=("none", "0", "20", "nostep")))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    assert "step report" not in log and "Traceback" not in log and "WARNING" not in log, log
    assert not list((tmp_path / "tmp").glob("numarun_steps.*")), log


@pytest.mark.parametrize(
    "case, job, env, args, head, verdict",
    [
        (
            "a few long steps",
            ("compute", "1", "5", "ddp"),
            {"STEP_WORK_S": "1"},
            (),
            r"5 steps of 2 ranks, [\d.]+ steps/s, a step [\d.]+ s",
            "=> too few steps to judge which rank holds the job back (4 steps of every rank, fewer than 12)",
        ),
        (
            "uneven data",
            ("input", "1", "40", "join"),
            {},
            (),
            r"30 to 40 steps of 2 ranks, ",
            "=> rank 1 holds the job back: input, ",
        ),
        (
            "a restart",
            ("input", "1", "40", "ddp"),
            {"STEP_FAIL_AT": "5"},
            ("--max-restarts", "1"),
            r"40 steps of 2 ranks after restart 1, ",
            "=> rank 1 holds the job back: input, ",
        ),
        (
            "two optimizers in turn",
            ("compute", "0", "40", "gan"),
            {},
            (),
            r"40 steps of 2 ranks, ",
            "=> rank 0 holds the job back: compute, ",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v and not v.startswith(("=>", "r")) else "",
)
def test_jobs_of_other_shapes_are_judged_on_what_their_ranks_recorded(
    tmp_path: Path,
    case: str,
    job: tuple[str, ...],
    env: dict[str, str],
    args: tuple[str, ...],
    head: str,
    verdict: str,
) -> None:
    """A few long steps are too few to name a rank; ranks whose data runs out at different steps (DDP's Join) are
    judged on the steps they all took; after a restart the records are the last attempt's; a GAN's two optimizers,
    stepped in turn, make one step. The slow rank, where there is one to name, is named with its phase."""
    code = _finish(_start(tmp_path, "--nproc-per-node", "2", *args, job=job, **env))
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    lines = _report(log)
    assert re.match("step report: " + head, lines[0]), lines
    assert _verdict(lines).startswith(verdict), lines
    records = list(read_records((_files(lines) / "steps.jsonl").read_text().splitlines()))
    steps = {r: max(x.step for x in records if x.rank == r) for r in (0, 1)}
    assert steps == ({0: 40, 1: 30} if case == "uneven data" else {0: int(job[2]), 1: int(job[2])}), steps
