"""scripts/setup.sh's torch step ('setup.sh torch'): the CPU index is asked quietly; when it cannot
serve the build, pip's configured sources are, and one line says what came from where and why; pip's
output shows only when both fail. Run on a fresh venv with a small wheel standing in for torch
(``NUMARUN_TORCH``), a dead local port as the CPU index and a file index as pip's own: no network,
no torch reinstalled."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO, free_port

pytestmark = pytest.mark.slow  # it makes a venv and runs pip

WHEEL = "numarun_probe-1.0-py3-none-any.whl"


def _index(root: Path, *, with_wheel: bool) -> str:
    """A PEP 503 file index; with the wheel or empty."""
    project = root / "simple" / "numarun-probe"
    project.mkdir(parents=True)
    links = ""
    if with_wheel:
        files = {
            "numarun_probe/__init__.py": "",
            "numarun_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: numarun_probe\nVersion: 1.0\n",
            "numarun_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n",
        }
        files["numarun_probe-1.0.dist-info/RECORD"] = (
            "".join(f"{name},,\n" for name in [*files, "x"][:-1]) + "numarun_probe-1.0.dist-info/RECORD,,\n"
        )
        with zipfile.ZipFile(project / WHEEL, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)
        links = f'<a href="{WHEEL}">{WHEEL}</a>'
    (project / "index.html").write_text(f"<html><body>{links}</body></html>\n")
    return (root / "simple").as_uri()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    subprocess.run([sys.executable, "-m", "venv", str(root / ".venv")], check=True, timeout=300)
    return root


def _setup(repo: Path, *, cpu_index: str, pip_index: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=pip_index,
        NUMARUN_TORCH="numarun_probe==1.0",
        NUMARUN_TORCH_INDEX=cpu_index,
    )
    return subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh"), "torch"], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_torch_step_says_in_one_line_what_came_from_where_and_why(repo: Path, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/simple"
    empty = _index(tmp_path / "empty", with_wheel=False)
    full = _index(tmp_path / "full", with_wheel=True)
    # both fail: pip's own words, both attempts, and exit 1
    r = _setup(repo, cpu_index=dead, pip_index=empty)
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.startswith("setup.sh: numarun_probe==1.0 could not be installed; pip said:\n"), r.stderr
    assert "127.0.0.1" in r.stderr and "No matching distribution" in r.stderr, r.stderr
    # the CPU index is reachable and lacks it
    r = _setup(repo, cpu_index=empty, pip_index=full)
    assert r.returncode == 0 and r.stderr == "", r
    url = (tmp_path / "full" / "simple" / "numarun-probe" / WHEEL).as_uri()
    assert r.stdout == (
        f"setup.sh: numarun_probe 1.0 (build) from {url}: from pip's configured sources, as {empty} "
        "has no numarun_probe==1.0 for this machine\n"
    ), r.stdout
    # installed: the step does nothing the next time
    assert _setup(repo, cpu_index=dead, pip_index=empty).stdout == ""


def test_an_unreachable_cpu_index_is_named_so(repo: Path, tmp_path: Path) -> None:
    subprocess.run(
        [str(repo / ".venv" / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "numarun_probe"],
        capture_output=True,
        timeout=120,
    )
    dead = f"http://127.0.0.1:{free_port()}/simple"
    r = _setup(repo, cpu_index=dead, pip_index=_index(tmp_path, with_wheel=True))
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout.count("\n") == 1 and r.stdout.endswith(
        f": from pip's configured sources, as {dead} was unreachable\n"
    )
