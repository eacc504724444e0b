"""The launcher's start-up savings (numarun.torch_private) change cost, never behaviour."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers import REPO

from numarun import torch_private as startup


def _stack_name(depth: int) -> str:
    # the reference: torchrun's own get_method_name, as torch writes it
    if len(inspect.stack()) > depth:
        return inspect.stack()[depth].function
    return "no_method_name"


def _caller_of_record(lookup, depth: int) -> str:  # type: ignore[no-untyped-def]
    def _record() -> str:  # called the way torchrun's rendezvous calls it
        return lookup(depth)

    return _record()


def _one_frame_down(fn):  # type: ignore[no-untyped-def]
    def lookup(d: int) -> str:  # one name for both, so that depth 0 compares alike
        return fn(d + 1)

    return lookup


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 5])
def test_method_name_is_what_inspect_stack_gives(depth: int) -> None:
    expected = _caller_of_record(_one_frame_down(_stack_name), depth)
    assert _caller_of_record(_one_frame_down(startup.method_name), depth) == expected


def test_method_name_past_the_outermost_frame() -> None:
    assert startup.method_name(10_000) == "no_method_name"
    assert _stack_name(10_000) == "no_method_name"


def test_install_replaces_torchs_lookup_and_keeps_the_event_names() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous.get_method_name
    try:
        assert startup.install() is True
        assert dynamic_rendezvous.get_method_name is startup.method_name

        def record(lookup):  # type: ignore[no-untyped-def]  # torchrun's _record(): lookup() at depth 2
            return lookup()

        def next_rendezvous(lookup):  # type: ignore[no-untyped-def]  # the method the event is named after
            return record(lookup)

        assert next_rendezvous(dynamic_rendezvous.get_method_name) == next_rendezvous(original) == "next_rendezvous"
    finally:
        dynamic_rendezvous.get_method_name = original


def test_install_leaves_a_torch_without_the_function_alone() -> None:
    module = types.ModuleType("fake_rendezvous")
    assert startup.install(module) is False
    assert not hasattr(module, "get_method_name")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "torch"), [(["--dry-run"], False), (["--dry-run", "--redirects", "3"], True), ([], True)]
)
def test_the_launcher_imports_torch_through_the_paused_collector(tmp_path, extra, torch) -> None:  # type: ignore[no-untyped-def]
    """Nothing on the run path imports torch before :func:`startup.import_torchrun` does (it
    would then find torch imported and freeze nothing), and the collector is on afterwards. A dry
    run imports torch only to check what needs it (``--redirects``)."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    code = (
        "import gc, json, sys\n"
        "from numarun import cli\n"
        f"rc = cli.main(['--nproc-per-node', '1', *{extra!r}, {str(script)!r}])\n"
        "print(json.dumps({'rc': rc, 'frozen': gc.get_freeze_count(), 'enabled': gc.isenabled(),"
        " 'torch': 'torch' in sys.modules}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0 and report["torch"] is torch and report["enabled"]
    assert not torch or report["frozen"] > 10_000, report  # torch's objects sit in the permanent generation


def test_the_private_parts_used_have_the_shape_they_were_checked_with() -> None:
    """Fails when torch changes anything numarun.torch_private relies on: then check the new
    torch and widen CHECKED, or change the patch."""
    import signal

    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    assert startup.checked(), (
        f"numarun.torch_private: torch {startup.torch_version()} is outside {startup.CHECKED}, the "
        "versions its private uses were checked on: check each against it, then widen CHECKED"
    )
    params = list(inspect.signature(dynamic_rendezvous.get_method_name).parameters.values())
    assert [(p.name, p.default) for p in params] == [("depth", 2)]
    assert list(inspect.signature(api.SignalException.__init__).parameters)[1:] == ["msg", "sigval"]
    e = startup.signal_exception(int(signal.SIGTERM))
    assert isinstance(e, api.SignalException) and e.sigval == signal.SIGTERM
    # route_signals: the agent installs whatever the module's name holds when its workers start
    assert (
        callable(api._terminate_process_handler)
        and "_terminate_process_handler" in api.PContext.start.__code__.co_names
    )
    # before_exit_barrier: the agent calls _exit_barrier(self) once its worker group succeeded
    from torch.distributed.elastic.agent.server import api as agent_api

    assert list(inspect.signature(agent_api.SimpleElasticAgent._exit_barrier).parameters) == ["self"]
    assert "_exit_barrier" in agent_api.SimpleElasticAgent._invoke_run.__code__.co_names
    assert startup.checked((2, 4)) and startup.checked((2, 15)) and not startup.checked((2, 16))
    assert not startup.checked((2, 3))


def test_outside_the_checked_versions_torch_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(startup, "torch_version", lambda: (9, 0))
    assert startup.install() is False and dynamic_rendezvous.get_method_name is original


def test_the_exit_barrier_calls_numarun_first_and_waits_whatever_it_raised() -> None:
    """torchrun's agent, its worker group done, calls numarun's callbacks and then its own barrier (torch's, on a
    store of one agent); a callback that fails is logged, never raised; None removes them."""
    import types

    from torch.distributed import HashStore
    from torch.distributed.elastic.agent.server import api as agent_api

    order: list[str] = []
    store = HashStore()
    agent = types.SimpleNamespace(
        _store=store,
        _worker_group=types.SimpleNamespace(group_world_size=1, state="SUCCEEDED"),
        _exit_barrier_timeout=10,
        _in_exit_barrier=False,
    )

    def fails() -> None:
        raise RuntimeError("boom")

    try:
        assert startup.before_exit_barrier(fails)
        startup._BEFORE_BARRIER.append(lambda: order.append(f"numarun, barrier keys {store.num_keys()}"))
        wrapped = agent_api.SimpleElasticAgent._exit_barrier
        wrapped(agent)  # type: ignore[arg-type]
        assert order == ["numarun, barrier keys 0"] and store.num_keys() > 0  # numarun first, then torch's barrier
        assert startup.before_exit_barrier(lambda: order.append("again"))
        assert agent_api.SimpleElasticAgent._exit_barrier is wrapped  # wrapped once, whatever the calls
    finally:
        startup.before_exit_barrier(None)
    assert startup._BEFORE_BARRIER == []


def test_a_ranks_error_file_is_read_back_by_torchelastic_as_numarun_names_it(tmp_path: Path) -> None:
    """The error file a rank writes has torchelastic's layout: torch's own ProcessFailure reads it, and
    the launcher's line takes the exception from it."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / "error.json"
    startup.record_error(str(path), ValueError("boom\nsecond line"), "Traceback ...")
    failure = ProcessFailure(local_rank=0, pid=42, exitcode=1, error_file=str(path))
    assert startup.failure_cause(failure) == "ValueError: boom"
    placeholder = ProcessFailure(local_rank=0, pid=42, exitcode=1, error_file=str(tmp_path / "none.json"))
    assert startup.failure_cause(placeholder) == ""  # torchelastic's own text when the rank wrote none


def test_no_other_module_touches_torch_or_hydra_private_parts() -> None:
    """torch's and Hydra's private parts are used in numarun.torch_private and numarun.hydra_internals only."""
    private = (
        "hydra._internal",
        "_terminate_process_handler",
        "get_method_name",
        "_return_value",
        "extraInfo",
        "record_exception",
        "SignalException",
    )
    found = [
        f"{p.relative_to(REPO)}: {word}"
        for p in sorted((REPO / "launcher").rglob("*.py"))
        if p.name not in ("torch_private.py", "hydra_internals.py")
        for word in private
        if word in p.read_text()
    ]
    assert found == []
