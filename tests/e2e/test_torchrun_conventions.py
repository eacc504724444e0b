"""torchrun's conventions kept by ``numarun run``: --nproc-per-node words, failures named, help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.options.choices import parse_nproc
from numarun.plan.model import PlanRequest
from numarun.plan.request import resolve_nproc


def test_nproc_words_are_torchruns() -> None:
    assert parse_nproc("4", "--nproc-per-node") == 4
    assert [parse_nproc(w, "--nproc-per-node") for w in ("auto", "cpu", "gpu", "xpu")] == ["auto", "cpu", "gpu", "xpu"]

    def n(word: str, gpus: int, xpus: int = 0) -> tuple[int | str | None, str | None]:
        r = resolve_nproc(PlanRequest(nproc_per_node=word), gpus, cpus=6, xpus=xpus)  # type: ignore[arg-type]
        return r.nproc_per_node, r.cuda_visible_devices

    assert n("gpu", 2) == (2, None) and n("auto", 2) == (2, None)
    assert n("auto", 0) == (6, None)  # torchrun: one per CPU without an accelerator
    assert n("cpu", 2) == (6, "")  # CPU-only ranks even where GPUs exist
    assert n("xpu", 0, xpus=3) == (3, "")
    for word in ("gpu", "xpu"):
        with pytest.raises(UsageError, match=f"--nproc-per-node '{word}'"):
            n(word, 0)
    assert resolve_nproc(PlanRequest(nproc_per_node=3), 0, cpus=6).nproc_per_node == 3


def _numarun(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_run_help_is_true(tmp_path: Path) -> None:
    out = _numarun(tmp_path, "run", "--help").stdout
    assert "--run-path" not in out and "--virtual-local-rank" not in out and "--virtual_local_rank" not in out
    assert "auto" in out and "cpu" in out


@pytest.mark.slow
def test_nproc_cpu_dry_run(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    proc = _numarun(tmp_path, "--dry-run", "--nproc-per-node", "cpu", str(script))
    assert proc.returncode == 0, proc.stderr
    assert f"--nproc-per-node={len(os.sched_getaffinity(0))}" in proc.stdout


@pytest.mark.slow
def test_failing_rank_is_named_with_its_exception(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text(
        "import os\n\ndef work():\n    if os.environ['RANK'] == '1':\n        raise ValueError('boom')\n\nwork()\n"
    )
    proc = _numarun(tmp_path, "--nproc-per-node", "2", str(script))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    # rank 0 may have ended on its own or been stopped by torchrun after rank 1 failed
    assert last.startswith("numarun: error: rank "), last
    assert re.search(r"rank 1 \(local rank 1, pid \d+\) failed: ValueError: boom \(exited with code 1\)", last), last
    # the user's traceback starts at the user's code, as 'python boom.py' prints it
    tb = proc.stderr[proc.stderr.index("Traceback (most recent call last):") :].splitlines()
    assert tb[1] == f'  File "{script}", line 7, in <module>'
    assert "runpy" not in proc.stderr and "bootstrap.py" not in proc.stderr


@pytest.mark.slow
def test_cuda_visible_devices_without_gpus_runs_cpu_ranks(tmp_path: Path, h200_tree: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    # a recorded machine without GPUs: the H200 host's tree with CUDA hidden is not it, so strip GPUs
    from numarun.topology.discover import load_topology

    topo = load_topology(str(h200_tree))
    if topo.gpus:
        import dataclasses

        (tmp_path / "nogpu.json").write_text(dataclasses.replace(topo, gpus=(), gpu_links=()).to_json())
        source = str(tmp_path / "nogpu.json")
    else:
        source = str(h200_tree)
    proc = _numarun(tmp_path, "--topology", source, str(script), env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "has none: running CPU-only ranks" in proc.stderr
