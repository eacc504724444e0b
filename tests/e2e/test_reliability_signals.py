"""Signals, one way: a storm of SIGUSR1/SIGUSR2/SIGTERM from numarun's first moment to its workers' run
loses nothing and ends as documented; Ctrl-C is exit 130 and one line; no handler can block.

The storm is paced on acknowledgements, not on time: the next signal goes once numarun has logged the
last one and every rank that exists has counted it (the kernel merges a signal sent again before the
first was delivered: that would be the test's loss, not numarun's).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import (
    REPO,
    SCRIPTS,
    SLEEPER,
    TIMEOUT,
    clean_env,
    error_lines,
    free_port,
    listening,
    numarun_cmd,
    wait_until,
)

STORM_RANK = str(SCRIPTS / "storm_rank.py")
COUNTER = str(SCRIPTS / "signal_counter")
USR = (signal.SIGUSR1, signal.SIGUSR2)


def _start(tmp: Path, *args: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """numarun in a session of its own, started as a relay starts it: once it says its handlers are in place."""
    (tmp / "tmp").mkdir(exist_ok=True)
    r, w = os.pipe()
    env = clean_env(
        PYTHONUNBUFFERED="1",
        TMPDIR=str(tmp / "tmp"),
        PYTHONPATH=COUNTER,
        SIGNAL_COUNT_DIR=str(tmp),
        NUMARUN_READY_FD=str(w),
    )
    p = subprocess.Popen(
        [*numarun_cmd(), "--log-level", "WARNING", *args],
        cwd=tmp,
        env=env,
        pass_fds=(w,),
        stdout=open(tmp / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    os.close(w)
    with os.fdopen(r, "rb") as ready:
        assert ready.read(1) == b"1", (tmp / "log").read_text()[-3000:]
    return p


def _counts(tmp: Path) -> dict[str, tuple[int, ...]]:
    out = {}
    for f in tmp.glob("count.[0-9]"):
        try:
            out[f.name] = tuple(int(x) for x in f.read_text().split())
        except (OSError, ValueError):
            continue
    return out


def _storm(p: subprocess.Popen, tmp: Path, until: str) -> tuple[dict[int, int], list[str]]:  # type: ignore[type-arg]
    """SIGUSR1 and SIGUSR2 in turn, each once the last was taken, until six went in phase ``until``:
    ``launcher`` (before the plan), ``rendezvous`` (the plan written, no rank yet), ``ranks`` (starting),
    ``run`` (every rank runs its script)."""
    sent = {int(s): 0 for s in USR}
    phases: list[str] = []
    log = tmp / "log"
    while phases.count(until) < 6:
        started = len(list(tmp.glob("started.*")))
        phases.append(
            "run"
            if started == 2
            else "ranks"
            if _counts(tmp)
            else "rendezvous"
            if list((tmp / "tmp").glob("numarun-*/plan.json"))
            else "launcher"
        )
        sig = USR[len(phases) % 2]
        p.send_signal(sig)
        sent[sig] += 1
        k = len(phases)
        wait_until(
            f"numarun to take signal {k}", lambda k=k: log.read_text().count("got SIGUSR") >= k, TIMEOUT, 0.01, proc=p
        )
        wait_until(
            f"every rank to count signal {k}",
            lambda k=k: all(sum(c) == k for c in _counts(tmp).values()),
            TIMEOUT,
            0.01,
            proc=p,
        )
    return sent, phases


@pytest.mark.slow
def test_a_storm_from_the_start_to_the_run_loses_nothing_and_stops_cleanly(tmp_path: Path) -> None:
    p = _start(tmp_path, "--nproc-per-node", "2", STORM_RANK, str(tmp_path))
    try:
        sent, phases = _storm(p, tmp_path, "run")
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGTERM)  # a second one while the first is taken changes nothing
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    assert code == 0 and "numarun: stopped by SIGTERM: every worker finished cleanly" in log, (code, log[-3000:])
    assert not error_lines(log) and "Traceback" not in log, log[-3000:]
    assert {"launcher", "rendezvous", "run"} <= set(phases), phases  # from before the plan to the ranks' run
    want = (sent[signal.SIGUSR1], sent[signal.SIGUSR2])
    assert _counts(tmp_path) == {"count.0": want, "count.1": want}, (phases, log[-3000:])
    assert not list((tmp_path / "tmp").glob("numarun-*")) or wait_until(
        "numarun's private directory to go", lambda: not list((tmp_path / "tmp").glob("numarun-*")), 30
    )


@pytest.mark.slow
def test_a_storm_during_a_rendezvous_that_never_completes_ends_in_one_line(tmp_path: Path) -> None:
    """Node 0 of two waits for a node that never comes (torch waits in C++): the SIGUSR1/2 are taken,
    then SIGTERM, twice, ends it with 143 and one line."""
    port = free_port()
    p = _start(
        tmp_path,
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--nproc-per-node",
        "1",
        "--master-port",
        str(port),
        STORM_RANK,
        str(tmp_path),
    )
    try:
        _, phases = _storm(p, tmp_path, "rendezvous")
        wait_until("the rendezvous store", lambda: listening(port), TIMEOUT, 0.05, proc=p)
        p.send_signal(signal.SIGTERM)
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    assert code == 128 + signal.SIGTERM, (code, log[-3000:])
    # torchrun took it ("all workers were ended": there were none), or the loop did while torch waited in C++
    assert error_lines(log) in (
        ["numarun: error: stopped by SIGTERM; all workers were ended"],
        ["numarun: error: stopped by SIGTERM; no worker was running"],
    ), log[-3000:]
    assert "Traceback" not in log and not list(tmp_path.glob("started.*")) and phases[0] == "launcher"
    wait_until("numarun's private directory to go", lambda: not list((tmp_path / "tmp").glob("numarun-*")), 30)


@pytest.mark.slow
def test_ctrl_c_is_exit_130_and_one_line(tmp_path: Path) -> None:
    """SIGINT to numarun's process group, as a terminal sends it: every rank ends quietly, and torchrun's agent
    says nothing of it either (its 'Received 2 death signal' and 'Sending process N closing signal' lines)."""
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    p = _start(tmp_path, "--nproc-per-node", "2", str(script), str(tmp_path))
    try:
        wait_until("both ranks to run", lambda: len(list(tmp_path.glob("started.*"))) == 2, TIMEOUT, 0.05, proc=p)
        os.killpg(p.pid, signal.SIGINT)
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    assert code == 130, log[-3000:]
    assert [line for line in log.splitlines() if line.strip()] == [
        "numarun: error: stopped by SIGINT; all workers were ended"
    ], log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]


def test_the_handlers_only_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every signal handler numarun installs, run in every phase under a profiler: no lock, no file or
    pipe I/O, no logging, no psutil, no sleep or wait, and no look-up of the phase table (the loop's). It
    raises nothing but what the loop asked the main thread to raise (END, and the supervisor's STOP)."""
    from numarun.errors import RunFailed
    from numarun.launch import signals
    from numarun.launch.supervisor import Supervisor
    from numarun.train.loop import STOP_SIGNALS

    saved = {s: signal.getsignal(s) for s in (*signals.RELAYED, signal.SIGCHLD)}
    sup = Supervisor()
    try:
        sup.hold_signals({})
        loop = sup.loop
        assert loop.handled == {*signals.DEATH, *signals.FORWARDED}
        for phase in signals.Phase:
            loop.phase = phase
            for signum in loop.handled:
                assert signal.getsignal(signum) == loop.handler  # one handler, installed once
                assert _traced(loop.handler, signum) is None, (phase, signum)
        loop._pending = RunFailed("stopped by SIGTERM; no worker was running", 143)  # as Loop.interrupt leaves it
        assert _traced(loop.handler, signal.SIGTERM) is RunFailed and loop.interrupted()
        stops = signals.Requests(STOP_SIGNALS)  # the trainer's, in each rank
        for signum in STOP_SIGNALS:
            assert _traced(signal.getsignal(signum), signum) is None
        assert stops.first() == STOP_SIGNALS[0]
    finally:
        if signals._LOOP is not None:
            signals._LOOP.close()
        for s, h in saved.items():
            signal.signal(s, h)


class _Target:
    def __init__(self) -> None:
        self.did: list[str] = []

    def forward(self, signum: int) -> None:
        self.did.append("forward")

    def stop(self, signum: int, *, again: bool) -> None:
        self.did.append("again" if again else "stop")

    def end(self, signum: int) -> BaseException:
        self.did.append("end")
        return _Stop("end", signum)


def test_the_loop_acts_as_the_phase_table_says() -> None:
    """Each phase's row of ON_SIGNAL, as the loop carries it out for its target (END: the main thread raises)."""
    from numarun.launch import signals

    saved = {s: signal.getsignal(s) for s in signals.RELAYED}
    loop = signals.loop()
    try:
        loop.handle(signals.RELAYED)
        want = {
            signals.Act.END: "end",
            signals.Act.STOP: "stop",
            signals.Act.AGAIN: "again",
            signals.Act.FORWARD: "forward",
            signals.Act.HOLD: "held",
        }
        for phase, acts in signals.ON_SIGNAL.items():
            for signum, act in ((signal.SIGTERM, acts[0]), (signal.SIGUSR1, acts[1])):
                target = _Target()
                loop.target, loop.phase, loop.held = target, phase, []
                try:
                    loop._act(signum)  # here in the main thread: END's interrupt reaches it at once
                except _Stop:
                    target.did.append("raised")
                done = target.did + (["held"] if loop.held else [])
                assert done == ([want[act], "raised"] if act is signals.Act.END else [want[act]]), (phase, signum, done)
                if act in (signals.Act.END, signals.Act.STOP):
                    assert loop.phase is signals.Phase.STOPPING
    finally:
        loop.close()
        for s, h in saved.items():
            signal.signal(s, h)


class _Stop(Exception):
    def __init__(self, msg: str, sigval: int) -> None:
        super().__init__(msg)


FORBIDDEN_MODULES = (
    "logging",
    "psutil",
    "threading",
    "subprocess",
    "fcntl",
    "pathlib",
    "shutil",
    "json",
    "numarun.ledger",
    "io",
    "select",
)
FORBIDDEN_BUILTINS = {
    "open",
    "print",
    "input",
    "flock",
    "lockf",
    "sleep",
    "select",
    "poll",
    "waitpid",
    "kill",
    "killpg",
    "read",
    "write",
    "fsync",
    "acquire",
    "__enter__",
    "wait",
    "join",
    "system",
    "fdopen",
    "allocate_lock",
    "RLock",
}
FORBIDDEN_NAMES = FORBIDDEN_BUILTINS | {
    "log",
    "logging",
    "warning",
    "info",
    "debug",
    "error",
    "exception",
    "Lock",
    "_lock",
    "lock",
    "psutil",
    "ledger",
    "fcntl",
    "Path",
    "ON_SIGNAL",
    "phase",
}


def _traced(handler: object, signum: int) -> type[BaseException] | None:
    """Run ``handler(signum, None)`` under a profiler; fails on any forbidden call, returns the exception type raised.

    The profiler does not see a ``with`` block's ``__enter__``: the handler's own bytecode may hold none,
    nor name a lock, a logger or a file."""
    import dis

    code = getattr(handler, "__code__", None)
    bad = [
        f"{i.opname} {i.argval}"
        for i in (dis.get_instructions(code) if code is not None else [])
        if i.opname in ("BEFORE_WITH", "SETUP_WITH", "BEFORE_ASYNC_WITH") or i.argval in FORBIDDEN_NAMES
    ]

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.split(".")[0] in FORBIDDEN_MODULES or module.startswith(FORBIDDEN_MODULES):
                bad.append(f"{module}.{frame.f_code.co_name}")
        elif event == "c_call" and getattr(arg, "__name__", "") in FORBIDDEN_BUILTINS:
            owner = getattr(arg, "__self__", None)
            bad.append(f"{type(owner).__name__ if owner is not None else arg.__module__}.{arg.__name__}")

    raised = None
    sys.setprofile(profile)
    try:
        handler(signum, None)  # type: ignore[operator]
    except BaseException as e:  # noqa: BLE001
        raised = type(e)
    finally:
        sys.setprofile(None)
    assert not bad, f"the handler for {signal.Signals(signum).name} calls {bad}"
    return raised


def test_every_signal_handler_in_numarun_is_one_of_the_traced_ones() -> None:
    """A new ``signal.signal(SIG, handler)`` in numarun must join the traced ones above (or be a default)."""
    import ast

    root = REPO / "launcher"
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "signal"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "signal"
            ):
                found.add((path.relative_to(root).as_posix(), ast.unparse(node.args[1])))
    defaults = {"signal.SIG_DFL", "signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL"}
    # the sidecar's (per-rank mode's agent, a process of its own): a stop writes where each rank stood
    traced = {"self.handler", "self.loop.handler", "self._record", "self._on_signal"}
    assert {h for _, h in found} - defaults == traced, sorted(found)
    assert {f for f, h in found if h not in defaults} == {
        "launch/signals.py",
        "launch/supervisor.py",
        "launch/sidecar.py",
    }, sorted(found)


def _as_pid_1(tmp: Path, *args: str) -> subprocess.Popen:  # type: ignore[type-arg]
    """numarun as PID 1 of a PID namespace of its own, as a container's command runs."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) for a PID namespace")
    (tmp / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *numarun_cmd(), *args],
        cwd=tmp,
        env=clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp / "tmp")),
        stdout=open(tmp / "log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _zombies_under(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children() if c.status() == psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_numarun_as_pid_1_reaps_every_orphan_and_exits_with_the_job(tmp_path: Path) -> None:
    """Each rank starts three short-lived daemons; whoever inherits them (PID 1) reaps them while the
    job runs; no zombie is left under PID 1, and the exit code is the job's."""
    p = _as_pid_1(tmp_path, "--nproc-per-node", "2", str(SCRIPTS / "short_daemons.py"), str(tmp_path))
    try:
        init = wait_until("PID 1 of the namespace", lambda: psutil.Process(p.pid).children(), TIMEOUT, 0.05, proc=p)[
            0
        ].pid
        wait_until("every daemon reaped", lambda: len(list(tmp_path.glob("reaped.*"))) == 2, TIMEOUT, 0.05, proc=p)
        assert _zombies_under(init) == []
        (tmp_path / "go").write_text("")
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    assert code == 0, log[-3000:]
    assert not error_lines(log) and "Traceback" not in log, log[-3000:]


@pytest.mark.slow
def test_sigterm_to_numarun_as_pid_1_is_143(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text(SLEEPER)
    p = _as_pid_1(tmp_path, "--nproc-per-node", "2", str(script), str(tmp_path))
    try:
        init = wait_until("PID 1 of the namespace", lambda: psutil.Process(p.pid).children(), TIMEOUT, 0.05, proc=p)[
            0
        ].pid
        wait_until("both ranks to run", lambda: len(list(tmp_path.glob("started.*"))) == 2, TIMEOUT, 0.05, proc=p)
        os.kill(init, signal.SIGTERM)
        code = p.wait(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    log = (tmp_path / "log").read_text()
    assert code == 128 + signal.SIGTERM, log[-3000:]
    assert error_lines(log) == ["numarun: error: stopped by SIGTERM; all workers were ended"], log[-3000:]
