"""``numarun run --preflight`` and ``numarun submit --preflight``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.cli import main as cli_main

NUMARUN = str(Path(sys.executable).parent / "numarun")


@pytest.fixture
def degraded(tmp_path, h200_tree) -> Path:
    root = tmp_path / "h200"
    shutil.copytree(h200_tree, root, symlinks=True)
    (root / "sys/bus/pci/devices/0000:00:06.0/current_link_width").write_text("8\n")
    return root


def _script(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    return script, marker


def test_run_preflight_stops_on_an_error_and_names_the_node(tmp_path, degraded, capsys, monkeypatch):
    script, marker = _script(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-07")
    rc = cli_main(["run", "--preflight", "--topology", str(degraded), "--nproc-per-node", "1", str(script)])
    err = capsys.readouterr().err
    assert rc == 1 and not marker.exists()
    assert "pcie-link" in err and "0000:00:06.0" in err
    assert "--exclude=gpu-07" in err
    assert "the job was not started" in err


def test_run_preflight_bad_input_is_exit_2(tmp_path, capsys):
    script, marker = _script(tmp_path)
    with pytest.raises(SystemExit) as e:  # refused where the flag is read, before anything else
        cli_main(["run", "--preflight", "--min-link-fraction", "0", "--nproc-per-node", "1", str(script)])
    rc = e.value.code
    err = capsys.readouterr().err
    assert rc == 2 and "--min-link-fraction" in err and len(err.strip().splitlines()) == 1 and not marker.exists()


@pytest.mark.slow
def test_run_preflight_on_a_healthy_node_runs_the_job(tmp_path):
    script, marker = _script(tmp_path)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("NUMARUN_TOPOLOGY", None)
    out = subprocess.run(
        [NUMARUN, "run", "--preflight", "--nproc-per-node", "1", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert marker.read_text() == "yes"
    assert "preflight: no errors" in out.stderr


@pytest.mark.slow
def test_submit_preflight_runs_the_doctor_on_every_node(tmp_path, capsys):
    script, _ = _script(tmp_path)
    rc = cli_main(
        ["submit", "--dry-run", "--nodes", "2", "--preflight", "--output-dir", str(tmp_path / "o"), str(script)]
    )
    text = capsys.readouterr().out
    assert rc == 0
    (line,) = [ln for ln in text.splitlines() if ln.startswith("launch_opts=")]
    assert "--preflight" in line
    rc = cli_main(["submit", "--dry-run", "--nodes", "2", "--output-dir", str(tmp_path / "o"), str(script)])
    assert "--preflight" not in capsys.readouterr().out
