"""Hydra's private parts numarun uses (numarun.hydra_internals) still have the shape it uses them in.

A Hydra release that renames, moves or changes the parameters of any of them fails here, by
name, instead of somewhere in a run; so does a Hydra outside the versions pyproject pins.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from numarun import hydra_internals

LAUNCHER = REPO / "launcher"


def _resolve(dotted: str) -> Any:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _instance_attribute(dotted: str) -> bool:
    """An attribute Hydra sets on its instances (found on a real one: an app, the global Hydra config)."""
    owner, name = dotted.rsplit(".", 1)
    if owner == "hydra._internal.hydra.Hydra":
        from numarun.config.compose import VERSION_BASE, config_dir

        obj = hydra_internals.create_app(
            task_name="t", config_path=str(config_dir()), extra_dir=None, version_base=VERSION_BASE
        )
    else:
        obj = _resolve(owner).instance()
    return hasattr(obj, name)


def test_the_installed_hydra_is_a_checked_version_and_pyproject_pins_those() -> None:
    import hydra

    low, high = hydra_internals.CHECKED
    installed = tuple(int(p) for p in re.findall(r"\d+", hydra.__version__)[:2])
    assert low <= installed <= high, (
        f"numarun.hydra_internals: hydra-core {hydra.__version__} is outside {low}..{high}, the versions its private "
        "uses were checked on: check hydra_internals.SHAPES against it, then widen CHECKED"
    )
    (pin,) = re.findall(r'"(hydra-core[^"]*)"', (REPO / "pyproject.toml").read_text())
    assert pin == f"hydra-core>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"


@pytest.mark.parametrize("dotted", sorted(hydra_internals.SHAPES))
def test_each_private_part_has_the_shape_numarun_uses(dotted: str) -> None:
    params, why = hydra_internals.SHAPES[dotted]
    assert why
    if params is None:  # an attribute
        try:
            _resolve(dotted)
        except AttributeError:
            assert _instance_attribute(dotted), f"{dotted} is gone"
        return
    obj = _resolve(dotted)
    assert callable(obj), dotted
    found = tuple(p for p in inspect.signature(obj).parameters if p != "self")
    assert found == params, f"{dotted} now takes {found}, numarun calls it with {params}"


def test_every_private_part_the_module_imports_is_listed() -> None:
    source = (LAUNCHER / "hydra_internals.py").read_text()
    imported = {
        f"{m}.{n.strip()}"
        for m, names in re.findall(r"from (hydra\._internal[\w.]*) import ([\w, ]+)", source)
        for n in names.split(",")
    }
    assert imported
    for name in imported:
        assert any(k == name or k.startswith(name + ".") for k in hydra_internals.SHAPES), f"{name} is not in SHAPES"


PRIVATE = re.compile(
    r"hydra\._internal|\b_save_config\b|HydraConfig\.instance\(\)\.cfg\s*=|OmegaConf\.save\s*=|\.setbase\("
)


def test_no_other_module_reaches_into_hydra() -> None:
    offenders = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in sorted(LAUNCHER.rglob("*.py"))
        if p.name != "hydra_internals.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert offenders == []


# --- worker side: what the patches do to the installed Hydra --------------------------------------


@pytest.fixture
def hydra_utils():  # type: ignore[no-untyped-def]
    """``hydra.core.utils`` and ``OmegaConf`` put back as they were after a test patches them."""
    import hydra.core.utils as utils
    from omegaconf import OmegaConf

    saved = utils.datetime, utils._save_config, OmegaConf.__dict__["save"]
    yield utils
    utils.datetime, utils._save_config = saved[:2]
    OmegaConf.save = saved[2]
    utils.setup_globals()


def test_the_pinned_clock_is_what_hydras_now_resolver_reads(hydra_utils) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    from omegaconf import OmegaConf

    when = dt.datetime(2020, 1, 2, 3, 4, 5)
    hydra_internals.worker_hook(when, writer=True)(hydra_utils)
    hydra_utils.setup_globals()
    assert OmegaConf.create({"t": "${now:%Y-%m-%d/%H-%M-%S}"}).t == "2020-01-02/03-04-05"


def test_off_rank_0_hydras_files_are_left_out(hydra_utils, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"hydra": {"mode": "RUN"}, "a": 1})
    hydra_internals.worker_hook(dt.datetime(2020, 1, 2), writer=False)(hydra_utils)
    hydra_utils._save_config(cfg, "config.yaml", tmp_path / ".hydra")
    OmegaConf.save(cfg, tmp_path / "mine.yaml")  # anything else is saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


@pytest.mark.slow
def test_a_worker_imports_no_hydra_until_the_script_does(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from numarun.worker import bootstrap, hydra_pin\n"
        "assert hydra_pin.install({'NUMARUN_HYDRA_NOW': '2020-01-02T03:04:05', 'RANK': '1'})\n"
        "print(sorted(m for m in ('hydra', 'omegaconf') if m in sys.modules))\n"
        "import hydra.core.utils as u\n"
        "print(u.datetime.now().isoformat(), u._save_config.__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "2020-01-02T03:04:05 <lambda>"]
