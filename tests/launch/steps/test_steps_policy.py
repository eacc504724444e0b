"""The step report's switch and interval (docs/steps.md, "Turning it off"): ``--step-report``,
``NUMARUN_STEP_REPORT`` and ``launcher.step_report`` resolve like every launch option, reach the ranks as
``NUMARUN_STEPS``; off, a rank installs no recorder."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.launch.steps import DEFAULT_INTERVAL_S, StepPolicy, StepReport, interval_from, steps_from
from numarun.options import launch as launch_options
from numarun.worker import phases


def _parse(argv: list[str], environ: dict[str, str]) -> launch_options.Options:
    parser = argparse.ArgumentParser(exit_on_error=False)
    launch_options.add_options(parser, ["step_report"])
    return launch_options.from_args(parser.parse_args(argv), environ)


def test_on_by_default_off_by_flag_variable_or_config() -> None:
    assert steps_from(_parse([], {}), {}) == StepPolicy(True, DEFAULT_INTERVAL_S)
    assert not steps_from(_parse(["--step-report", "off"], {}), {}).on
    assert not steps_from(_parse([], {"NUMARUN_STEP_REPORT": "off"}), {}).on
    assert steps_from(_parse(["--step-report", "on"], {"NUMARUN_STEP_REPORT": "off"}), {}).on  # the flag wins
    configured = _parse([], {}).with_config({"step_report": "off"})
    assert (
        configured.step_report is StepReport.OFF and configured.setting("step_report").where == "launcher.step_report"
    )
    assert ("step_report", str) in launch_options.config_keys()


def test_a_bad_value_is_one_line_naming_it() -> None:
    with pytest.raises(UsageError, match=r"^bad NUMARUN_STEP_REPORT 'maybe': expected one of on, off$"):
        _parse([], {"NUMARUN_STEP_REPORT": "maybe"})
    with pytest.raises(UsageError, match=r"^bad NUMARUN_STEP_INTERVAL 'soon': expected a finite number of seconds"):
        interval_from({"NUMARUN_STEP_INTERVAL": "soon"})
    assert interval_from({"NUMARUN_STEP_INTERVAL": "0.5"}) == 0.5


def test_the_ranks_are_told_and_off_install_no_recorder(tmp_path: Path) -> None:
    assert StepPolicy(True, 0.5).worker_env() == {"NUMARUN_STEPS": "1", "NUMARUN_STEP_INTERVAL": "0.5"}
    off = StepPolicy(False).worker_env()
    assert off["NUMARUN_STEPS"] == "0"
    assert phases.install({**off, "NUMARUN_STATE_DIR": str(tmp_path), "LOCAL_RANK": "0"}) is None
    assert phases.install({"NUMARUN_STEPS": "1"}) is None  # not started by numarun: no private directory
    assert list(tmp_path.iterdir()) == []
