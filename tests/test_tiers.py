"""The fast tier (``-m "not slow"``) never starts a process: tests/conftest.py refuses it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest
from helpers import REPO


def test_unmarked_test_cannot_start_a_process() -> None:
    with pytest.raises(RuntimeError, match=r"starts a process: mark it @pytest.mark.slow"):
        subprocess.run(["true"], check=False)
    with pytest.raises(RuntimeError, match="mark it"):
        os.system("true")
    with pytest.raises(RuntimeError, match="mark it"):
        if os.fork() == 0:  # only if the guard failed: the child must not run the rest of the suite
            os._exit(0)
    ctx = multiprocessing.get_context("spawn")
    with pytest.raises(RuntimeError, match="mark it"):
        ctx.Process(target=print).start()


@pytest.mark.slow
def test_slow_test_can() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0


@pytest.mark.slow
def test_the_fast_tier_passes_on_a_fresh_machines_empty_cache(tmp_path) -> None:  # noqa: ANN001
    """The run parser is built from torchrun's options, which a child interpreter reads once and caches; on a
    fresh machine (an empty ``$XDG_CACHE_HOME``) the fast tier's tests that build it must still pass."""
    import sys

    repo = REPO
    test = "tests/launch/test_launch_net.py::test_ipv6_forms_reach_torchrun_in_brackets"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-m", "not slow", test],
        cwd=repo,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert list((tmp_path / "numarun").glob("torchrun-options.*.json"))


def test_the_scheduling_names_are_test_files() -> None:
    """conftest's units and longest-first order name test files by their base names: a renamed file must not
    silently fall out of its unit (two tests of one machine-wide resource would then run at once)."""
    import conftest

    names = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    units = set(conftest.SHARED.values())
    assert set(conftest.SHARED) <= names, set(conftest.SHARED) - names
    assert {u for u in conftest.LONGEST_FIRST if u not in units} <= names
