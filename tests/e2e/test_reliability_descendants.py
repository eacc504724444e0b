"""Nothing left behind: every process a job starts ends with numarun, in whatever session it
runs; a forwarded signal reaches every worker whenever it arrives; a rendezvous after a restart
has a deadline too. Real numarun, torchrun and worker processes (gloo, CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from helpers import SCRIPTS, SLEEPER, TIMEOUT, clean_env, error_lines, handles, numarun_cmd, wait_until

pytestmark = pytest.mark.slow


def _daemons(out: Path) -> list[int]:
    return [int(p) for f in sorted(out.glob("daemons.*")) if not f.name.endswith(".tmp") for p in f.read_text().split()]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _gone(pids: list[int]) -> bool:
    return not _alive(pids)


def _start(tmp: Path, *args: str, **env: str) -> subprocess.Popen:  # type: ignore[type-arg]
    (tmp / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [*numarun_cmd(), *args],
        cwd=tmp,
        env=clean_env(TMPDIR=str(tmp / "tmp"), **env),
        stdout=open(tmp / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
def reap():
    """Kill whatever a failing test left (never the test runner's own processes)."""
    left: list[int] = []
    yield left
    for pid in _alive(left):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["kill -9", "normal exit"])
def test_no_process_a_rank_started_outlives_numarun(tmp_path, reap, how):
    mode = "block" if how == "kill -9" else "exit"
    p = _start(tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "spawn_daemons.py"), str(tmp_path), mode)
    try:
        daemons = wait_until(
            "both ranks' daemons", lambda: len(_daemons(tmp_path)) == 4 and _daemons(tmp_path), TIMEOUT
        )
        reap.extend(daemons)
        assert len(_alive(daemons)) == 4  # in sessions of their own: no process group reaches them
        if how == "kill -9":
            os.kill(p.pid, signal.SIGKILL)
        else:
            (tmp_path / "go").write_text("")
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    if how == "normal exit":
        assert code == 0, (tmp_path / "log").read_text()[-3000:]
    wait_until("every daemon to end", lambda: _gone(daemons), 30)
    wait_until("numarun's private directory to go", lambda: not list((tmp_path / "tmp").glob("numarun-*")), 30)


def _workers(p: subprocess.Popen) -> list[psutil.Process]:  # type: ignore[type-arg]
    try:
        return [c for c in psutil.Process(p.pid).children(recursive=True) if "sleep.py" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


# The moments of a start, each a condition on what numarun has done so far (never a fixed delay).
MOMENTS = {
    "at once": lambda p, run: True,
    "its handlers in place": lambda p, run: handles(p.pid, signal.SIGUSR2),
    "its private directory made": lambda p, run: list((run / "tmp").glob("numarun-*")),
    "a worker process started": lambda p, run: _workers(p),
    "one rank running": lambda p, run: list(run.glob("started.*")),
    "both ranks running": lambda p, run: len(list(run.glob("started.*"))) == 2,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_forwarded_signal_reaches_the_workers_at_every_point_of_the_start(tmp_path, moment):
    """SIGUSR2 to numarun at each moment from its start to its workers' run: whenever it comes, the
    workers get it (the script has no handler, so they die of it) and numarun ends; never a run
    whose workers keep going while numarun waits."""
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    p = _start(tmp_path, "--nproc-per-node", "2", str(script), str(tmp_path))
    try:
        wait_until(moment, lambda: MOMENTS[moment](p, tmp_path), TIMEOUT, 0.01, proc=p)
        p.send_signal(signal.SIGUSR2)
        code = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SIGUSR2 at {moment} was lost: numarun still waits, workers {[w.pid for w in _workers(p)]}")
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    if code == -signal.SIGUSR2:
        # before numarun's own code ran (the interpreter was starting): it died of the signal
        # itself, and no worker ever started
        assert moment == "at once" and not list(tmp_path.glob("started.*")), (moment, log[-2000:])
    else:
        assert code == 1 and "killed by SIGUSR2" in log and "Traceback" not in log, (moment, code, log[-2000:])


def test_a_death_signal_before_any_worker_ends_the_run_in_one_line(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    p = _start(tmp_path, "--nproc-per-node", "2", str(script), str(tmp_path))
    # as soon as numarun handles it: it is still importing torch for the parser then, seconds before a worker
    wait_until("numarun's handler for SIGTERM", lambda: handles(p.pid, signal.SIGTERM), TIMEOUT, 0.005, proc=p)
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=120)
    log = (tmp_path / "log").read_text()
    assert code == 128 + signal.SIGTERM, log[-2000:]
    assert error_lines(log) == ["numarun: error: stopped by SIGTERM; no worker was running"], log[-2000:]
    assert not list(tmp_path.glob("started.*"))
    wait_until("numarun's private directory to go", lambda: not list((tmp_path / "tmp").glob("numarun-*")), 30)


def test_every_rendezvous_has_a_deadline_restarts_included(tmp_path, monkeypatch):
    """The loop ends numarun when no worker has run for longer than the rendezvous deadline: before
    the first group, and between groups (a restart's re-rendezvous), naming which one it was."""
    from numarun import ledger
    from numarun.launch.signals import Phase
    from numarun.launch.spec import LaunchSpec
    from numarun.launch.supervisor import Supervisor, _Job
    from numarun.launch.torchrun import Target

    sup = Supervisor()
    sup.private_dir = tmp_path  # no cleaner, no cage: the loop's watch alone, on a clock of our own
    alive: list[int] = []
    monkeypatch.setattr(sup, "live_workers", lambda: list(alive))
    died: list[tuple[int, str]] = []
    monkeypatch.setattr(sup, "die", lambda code, message: died.append((code, message)))
    spec = LaunchSpec(target=Target("script", "x.py"), nproc_per_node=1, rdzv_conf=(("timeout", "1"),), rdzv_margin_s=1)
    sup._job = _Job(spec, *spec.rendezvous_deadline(), abort=None, idle_since=0.0)
    import threading
    import types

    sup._loop = types.SimpleNamespace(lock=threading.Lock(), phase=Phase.RENDEZVOUS)  # the loop's side alone
    # a group ran (registered, alive), then its worker failed and the restart's rendezvous hangs
    (tmp_path / "pid.0").write_text("4242 0\n")
    alive.append(4242)
    sup._tick(100.0)  # alive: the deadline starts again from here
    assert sup._loop.phase is Phase.RUNNING
    alive.clear()
    sup._tick(101.5)
    assert not died
    sup._tick(102.0)
    ((code, message),) = died
    assert code == 1 and message.startswith(
        "the rendezvous after restart 1 did not complete within 2 s (timeout=1 + 1 s)"
    )
    assert ledger.workers(tmp_path) == {"0": (4242, 0)}
