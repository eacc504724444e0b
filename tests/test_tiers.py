"""The fast tier (``-m "not slow"``) never starts a process: tests/conftest.py refuses it."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest


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
