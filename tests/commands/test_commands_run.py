"""``numarun run``'s variants take one road: each settles its options once, through :meth:`Road.settle` and
:func:`numarun.launch.planning.settle` (per-node mode, per-rank mode, numarun's trainer, ``--preflight``), and the
pre-flight checks the nodes with the options the launch then uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import FIXTURES
from refusals import EXIT, TRAIN, run_in_process
from schedulers import slurm_env

from numarun.commands import run
from numarun.doctor import preflight as doctor_preflight
from numarun.doctor.diagnose import Settings
from numarun.doctor.schedule import LinkSchedule
from numarun.launch import planning
from numarun.options.launch import LaunchOptions, Source

P4D = str(FIXTURES / "nvidia-smi" / "aws-p4d.24xlarge.txt")
ONE_NODE_STEP = slurm_env(nodes="node1", names=("node1",))
"""A Slurm step of one node, one task: per-node mode."""
TWO_RANKS_STEP = slurm_env(nodes="node1", names=("node1",), per_node=2, local=1)
"""A Slurm step of one node, two tasks: per-rank mode, this task local rank 1."""


@pytest.fixture
def settles(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[LaunchOptions]]:
    """The options each settling was handed: the road's (``Road.settle``) and the one function beneath it."""
    seen: dict[str, list[LaunchOptions]] = {"road": [], "settle": []}
    road_settle, settle = run.Road.settle, planning.settle

    def on_road(self: run.Road, options: LaunchOptions, **kw: Any) -> planning.Settled:
        seen["road"].append(options)
        return road_settle(self, options, **kw)

    def on_settle(options: LaunchOptions, *a: Any, **kw: Any) -> planning.Settled:
        seen["settle"].append(options)
        return settle(options, *a, **kw)

    monkeypatch.setattr(run.Road, "settle", on_road)
    monkeypatch.setattr(run, "settle", on_settle)
    return seen


def _numarun(argv: list[str], env: dict[str, str], tmp_path: Path, capsys: Any, monkeypatch: Any) -> str:
    code, err = run_in_process(argv, tmp_path, capsys, monkeypatch, env=env)
    assert code == 0, err
    return err


def test_the_preflight_checks_the_nodes_with_the_options_settled_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, settles: dict[str, list]
) -> None:
    """``--preflight`` in a job a scheduler started: the doctor gets the options settled against the job, and the
    launch that follows uses those same options; nothing settles them a second time."""
    checked: list[tuple[LaunchOptions, Settings]] = []
    launched: list[run.Prepared] = []
    monkeypatch.setattr(doctor_preflight, "preflight", lambda options, settings: checked.append((options, settings)))
    monkeypatch.setattr(run.Road, "supervise", lambda self, ready, job_env, run_dir=None: launched.append(ready) or 0)
    argv = ["--preflight", "--link-schedule", "bounded", "--topology", P4D, "--nproc-per-node", "1", EXIT, "0", "0"]
    _numarun(argv, ONE_NODE_STEP, tmp_path, capsys, monkeypatch)
    assert len(settles["road"]) == len(settles["settle"]) == 1
    ((options, settings),) = checked
    assert settings == Settings(link_schedule=LinkSchedule.BOUNDED)  # the doctor's flags, read once, typed
    assert options.setting("node_rank").source is Source.JOB  # settled against the step
    (ready,) = launched
    assert ready.options is options  # the launch runs with what the doctor checked


def test_per_rank_mode_settles_once_through_the_road(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, settles: dict[str, list]
) -> None:
    """A task that is one rank settles the way every launch does: the road's one settling, per-rank mode's branch
    of it (the rendezvous the tasks share), nothing of its own."""
    err = _numarun(["--dry-run", "--topology", P4D, EXIT, "0", "0"], TWO_RANKS_STEP, tmp_path, capsys, monkeypatch)
    assert "per-rank mode (rank 1 of 2, local rank 1)" in err
    assert len(settles["road"]) == len(settles["settle"]) == 1


def test_the_trainer_settles_each_job_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, settles: dict[str, list]
) -> None:
    """numarun's trainer settles each composed job once, its ``launcher`` group a source of the options settled."""
    argv = ["--dry-run", "--topology", P4D, "--nproc-per-node", "1", TRAIN, "launcher.binding=node"]
    _numarun(argv, ONE_NODE_STEP, tmp_path, capsys, monkeypatch)
    assert len(settles["road"]) == len(settles["settle"]) == 1
    (options,) = settles["settle"]
    assert options.setting("binding").where == "launcher.binding"  # the job's config, settled with the rest


def test_run_and_the_doctor_read_the_doctors_flags_into_one_typed_settings() -> None:
    from numarun.cli import build_parser
    from numarun.commands.doctor import settings_of

    flags = ["--min-link-fraction", "0.25", "--link-schedule", "all-pairs", "--doctor-timeout", "9"]
    doctor = build_parser(only="doctor").parse_args(["doctor", *flags])
    preflight = build_parser(only="run").parse_args(["run", "--preflight", *flags, EXIT])
    want = Settings(min_link_fraction=0.25, doctor_timeout=9.0, link_schedule=LinkSchedule.ALL_PAIRS)
    assert settings_of(doctor) == run.preflight_of(preflight) == want
    dry = build_parser(only="run").parse_args(["run", "--preflight", "--dry-run", EXIT])
    assert run.preflight_of(dry) is None  # a dry run starts nothing, checks nothing
