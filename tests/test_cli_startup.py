"""Help screens and --version start without importing torch, and show what the full parsers show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numarun import cli
from numarun.launch import torchrun as torchrun_mod
from numarun.launch import torchrun_options

REGEN = os.environ.get("NUMARUN_REGEN_GOLDEN") == "1"
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(\s*)(\S+)$")


def _imported(argv: list[str]) -> tuple[set[str], str]:
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "numarun", *argv],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0, r.stderr[-2000:]
    mods = {m.group(2) for line in r.stderr.splitlines() if (m := IMPORT_LINE.match(line))}
    return mods, r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["-h"]] + [[c, "--help"] for c in cli._available_commands()] + [["run", "-h"]]
)
def test_help_never_imports_torch(argv: list[str]) -> None:
    mods, out = _imported(argv)
    assert out.strip(), "printed nothing"
    heavy = sorted(m for m in mods if m == "torch" or m.startswith(("torch.", "hydra", "numpy")))
    assert not heavy, f"numarun {' '.join(argv)} imported {heavy[:5]}"


@pytest.mark.slow
def test_main_help_lists_every_command_with_its_summary() -> None:
    _, out = _imported(["--help"])
    for name in cli._available_commands():
        assert re.search(rf"^\s+{name}\s+\S", out, re.M), f"{name} missing from:\n{out}"
    assert "see 'numarun" not in out  # every command module has a docstring summary
    assert "measure" in out  # tune's summary, read from its module docstring


def _run_help(for_help: bool) -> str:
    try:
        parser = cli.build_parser("run", for_help=for_help)
    finally:
        torchrun_mod._FOR_HELP = False
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    return sub.choices["run"].format_help()


def _recorded_torch_installed() -> bool:
    return torchrun_options.installed_torch_version() == torchrun_options.TORCH_VERSION


def test_run_help_from_the_record_matches_torchruns_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The help screen is the same with the record (the recorded torch) or without it (any other
    torch, e.g. a GPU host's build): the record is used only when it fits."""
    monkeypatch.setenv("COLUMNS", "100")
    if _recorded_torch_installed():
        assert torchrun_options.help_parser() is not None
    else:
        assert torchrun_options.help_parser() is None  # another torch: its own parser serves the help
    assert _run_help(True) == _run_help(False)


def test_record_matches_installed_torch() -> None:
    """The record is torchrun's parser for the recorded version; with another torch installed, the
    record must then be ignored, and is."""
    import torch
    from torch.distributed.run import get_args_parser

    path = Path(torchrun_options.__file__)
    if REGEN:
        path.write_text(torchrun_options.render_module(get_args_parser(), torch.__version__))
        pytest.skip(f"regenerated {path}")
    assert torchrun_options.installed_torch_version() == torch.__version__
    if not _recorded_torch_installed():
        assert torchrun_options.help_parser() is None
        return
    assert json.loads(json.dumps(torchrun_options.record(get_args_parser()))) == list(torchrun_options.OPTIONS), (
        "torchrun's options changed: regenerate with NUMARUN_REGEN_GOLDEN=1"
    )


def test_help_only_detection() -> None:
    assert cli._help_only(["run", "--help"], "run")
    assert cli._help_only(["run", "--standalone", "-h"], "run")
    assert not cli._help_only(["run", "train.py", "--help"], "run")  # the script's own --help
    assert not cli._help_only(["run", "--nproc-per-node", "2", "--help"], "run")  # not sure: full parser
    assert not cli._help_only(["run", "train.py"], "run")


def test_record_is_ignored_for_another_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchrun_options, "installed_torch_version", lambda: "0.0.0")
    assert torchrun_options.help_parser() is None
