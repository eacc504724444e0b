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
from numarun.options import torchrun as torchrun_mod

IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(\s*)(\S+)$")


def _imported(argv: list[str]) -> tuple[set[str], str]:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "numarun", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
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


def test_torchruns_options_rebuilt_from_the_record_are_torchruns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser numarun rebuilds from the record has torchrun's options, defaults and help screen."""
    from torch.distributed.run import get_args_parser

    for k in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("COLUMNS", "100")
    real, rebuilt = get_args_parser(), torchrun_mod.torchrun_parser()
    fields = ("option_strings", "dest", "default", "nargs", "choices", "required", "help", "metavar")
    for a, b in zip(real._actions, rebuilt._actions, strict=True):
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields], a.dest
        assert b.type is (a.type if a.type in (int, float) else None), a.dest
    rebuilt.prog = real.prog
    assert rebuilt.format_help() == real.format_help()


@pytest.mark.slow
def test_record_is_built_once_per_torch_version_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any torch version: the record is read from that torch (a child interpreter) on first use, kept in
    $XDG_CACHE_HOME, and read from there afterwards; a cache that cannot be written is skipped."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torchrun_mod, "installed_torch_version", lambda: "9.9.9+other")
    torchrun_mod.torchrun_record.cache_clear()
    try:
        record = torchrun_mod.torchrun_record()
        cached = tmp_path / "numarun" / f"torchrun-options.{torchrun_mod.RECORD_FORMAT}.9.9.9+other.json"
        assert json.loads(cached.read_text()) == list(record)
        # warm: what the file says is what numarun serves (no child interpreter again)
        changed = [{**o, "help": "FROM THE CACHE"} if o["dest"] == "role" else o for o in record]
        cached.write_text(json.dumps(changed))
        torchrun_mod.torchrun_record.cache_clear()
        assert "FROM THE CACHE" in torchrun_mod.torchrun_parser().format_help()
        # a cache that cannot be written (a file where its directory should be): built, served, not stored
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
        torchrun_mod.torchrun_record.cache_clear()
        assert torchrun_mod.torchrun_record() == record
    finally:
        torchrun_mod.torchrun_record.cache_clear()


@pytest.mark.slow
def test_run_help_with_an_empty_cache_never_imports_torch(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "numarun", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )
    assert r.returncode == 0 and "--rdzv-backend" in r.stdout, r.stderr[-2000:]
    mods = {m.group(2) for line in r.stderr.splitlines() if (m := IMPORT_LINE.match(line))}
    assert not {m for m in mods if m == "torch" or m.startswith("torch.")}
    assert list((tmp_path / "numarun").glob("torchrun-options.*.json"))


def test_help_only_detection() -> None:
    assert cli._help_only(["run", "--help"], "run")
    assert cli._help_only(["run", "--standalone", "-h"], "run")
    assert not cli._help_only(["run", "train.py", "--help"], "run")  # the script's own --help
    assert not cli._help_only(["run", "--nproc-per-node", "2", "--help"], "run")  # not sure: full parser
    assert not cli._help_only(["run", "train.py"], "run")
