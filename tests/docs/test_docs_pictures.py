"""The documentation's pictures (docs/img/) are what numarun draws today for their recorded machines.

Regenerate after an intended change in the drawing with ``.venv/bin/python scripts/docs_pictures.py``
and look at the pictures before committing them. A machine is one line of the script's ``MACHINES``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import REPO


def _pictures_module():
    spec = importlib.util.spec_from_file_location("docs_pictures", REPO / "scripts" / "docs_pictures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_pictures", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_pictures_are_current(monkeypatch: pytest.MonkeyPatch) -> None:
    pictures = _pictures_module()
    monkeypatch.chdir(REPO)  # the pictures name their topology as given, relative to the repository
    drawn = pictures.draw_all()
    assert len(drawn) == 2 * len(pictures.MACHINES) + len(pictures.STEP_JOBS)
    assert not pictures.stale(drawn), (
        f"pictures not current: {pictures.stale(drawn)}; run .venv/bin/python scripts/docs_pictures.py"
    )


def test_each_picture_is_on_a_concepts_page() -> None:
    pictures = _pictures_module()
    concepts = "".join((REPO / "docs" / page).read_text(encoding="utf-8") for page in ("topology.md", "plan.md"))
    for machine in pictures.MACHINES:
        for kind in ("topo", "plan"):
            assert f"](img/{machine.name}-{kind}.svg)" in concepts, (machine.name, kind)


def test_each_step_report_picture_is_on_the_step_report_page() -> None:
    pictures = _pictures_module()
    page = (REPO / "docs" / "steps.md").read_text(encoding="utf-8")
    assert all(f"](img/{name}.svg)" in page for name, _ in pictures.STEP_JOBS)


def test_a_plan_picture_colours_its_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan picture is not the topology picture again: it carries the plan's ranks."""
    pictures = _pictures_module()
    monkeypatch.chdir(REPO)
    drawn = pictures.draw(pictures.MACHINES[0], tmp_path)
    topo, plan = (drawn[f"{pictures.MACHINES[0].name}-{k}.svg"] for k in ("topo", "plan"))
    assert plan != topo and "rank 7" in plan and "rank 7" not in topo
