"""Users' own public Hydra apps under numarun, compared with the same apps under plain torchrun.

Each case runs ``python -m torch.distributed.run --nproc-per-node 2 APP ARGS`` in one
directory and ``numarun --nproc-per-node 2 APP ARGS`` in another, then compares what each
rank printed and every file Hydra wrote (timestamps and the working directory normalised).
The apps are copied from facebookresearch/hydra (tests/fixtures/hydra_apps/SOURCES.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO, free_port, listening, wait_until

pytestmark = pytest.mark.slow

APPS = FIXTURES / "hydra_apps"
ENTRY = REPO / "launcher" / "worker" / "entry.py"
STAMP = re.compile(r"\d{4}-\d{2}-\d{2}/\d{2}-\d{2}-\d{2}|\[\d{4}-\d{2}-\d{2} [\d:,]+\]")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NUMARUN_HYDRA_NOW", None)
    env["PYTHONWARNINGS"] = "ignore"  # the upstream apps leave version_base unset: Hydra warns
    return env


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _logs(cwd: Path) -> Path:
    return cwd.parent / f"{cwd.name}-logs"


def _redirect(cwd: Path) -> list[str]:
    # each rank's stdout in its own file: two ranks printing at once can share a line on a pipe
    return ["--log-dir", str(_logs(cwd)), "--redirects", "1"]


def torchrun(cwd: Path, app: Path, *args: str, redirect: bool = False) -> subprocess.CompletedProcess[str]:
    extra = _redirect(cwd) if redirect else []
    return _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *extra, str(app), *args], cwd)


def numarun(cwd: Path, app: Path, *args: str, redirect: bool = False) -> subprocess.CompletedProcess[str]:
    extra = _redirect(cwd) if redirect else []
    return _run([sys.executable, "-m", "numarun", "--nproc-per-node", "2", *extra, str(app), *args], cwd)


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` -> its text, with timestamps and ``root`` normalised."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix != ".log" and "numarun" not in p.name:
            rel = STAMP.sub("<ts>", str(p.relative_to(root)))
            out[rel] = STAMP.sub("<ts>", p.read_text().replace(str(root), "<cwd>"))
    return out


def run_dirs(root: Path) -> set[Path]:
    return {p.parent.parent for p in root.rglob(".hydra/config.yaml")}


def stdout_lines(proc: subprocess.CompletedProcess[str], root: Path) -> list[str]:
    text = proc.stdout + "".join(p.read_text() for p in sorted(_logs(root).rglob("stdout.log")))
    return sorted(STAMP.sub("<ts>", ln.replace(str(root), "<cwd>")) for ln in text.splitlines() if ln.strip())


def compare(tmp_path: Path, app: Path, *args: str) -> tuple[Path, dict[str, str]]:
    plain, ours = tmp_path / "torchrun", tmp_path / "numarun"
    plain.mkdir()
    ours.mkdir()
    expected = torchrun(plain, app, *args, redirect=True)
    got = numarun(ours, app, *args, redirect=True)
    assert stdout_lines(got, ours) == stdout_lines(expected, plain)
    files = tree(ours)
    if len(run_dirs(plain)) == 1:  # torchrun's ranks can straddle a second: two run dirs
        assert files == tree(plain)
    assert len(run_dirs(ours)) <= 1 or "multirun.yaml" in "".join(files)
    return ours, files


def test_structured_config_app_takes_overrides(tmp_path: Path) -> None:
    _, files = compare(tmp_path, APPS / "structured_minimal" / "my_app.py", "port=1")
    (cfg,) = [t for k, t in files.items() if k.endswith(".hydra/config.yaml")]
    assert yaml.safe_load(cfg) == {"host": "localhost", "port": 1}


def test_structured_defaults_app_with_group_choice(tmp_path: Path) -> None:
    _, files = compare(tmp_path, APPS / "structured_defaults" / "my_app.py", "db=postgresql", "db.timeout=5")
    (cfg,) = [t for k, t in files.items() if k.endswith(".hydra/config.yaml")]
    assert yaml.safe_load(cfg)["db"]["timeout"] == 5 and yaml.safe_load(cfg)["db"]["driver"] == "postgresql"


def test_config_name_flag_is_recorded(tmp_path: Path) -> None:
    _, files = compare(tmp_path, APPS / "job_name" / "with_config_file_override.py", "-cn", "alt")
    (cfg,) = [t for k, t in files.items() if k.endswith(".hydra/config.yaml")]
    assert yaml.safe_load(cfg) == {"which": "alt"}
    (hydra_yaml,) = [t for k, t in files.items() if k.endswith(".hydra/hydra.yaml")]
    assert yaml.safe_load(hydra_yaml)["hydra"]["job"]["config_name"] == "alt"


def test_run_dir_from_the_config_file_is_reused(tmp_path: Path) -> None:
    app = APPS / "workdir" / "my_app.py"
    ours, files = compare(tmp_path, app)
    assert {k.split("/")[0] for k in files} == {"run_dir"}
    numarun(ours, app)  # again: the same dir, as Hydra does (no run_dir_1)
    assert sorted(p.name for p in ours.iterdir()) == ["run_dir"]


def test_run_dir_dot_writes_into_the_working_dir(tmp_path: Path) -> None:
    ours, _ = compare(tmp_path, APPS / "job_name" / "with_config_file_override.py", "hydra.run.dir=./")
    assert (ours / ".hydra" / "config.yaml").is_file() and not (ours / "outputs").exists()


def _without_launcher(files: dict[str, str]) -> dict[str, object]:
    """The files, with the launcher a run chose taken out of Hydra's records of it (hydra.yaml, multirun.yaml)."""
    out: dict[str, object] = {}
    for name, text in files.items():
        data = yaml.safe_load(text) if name.endswith(".yaml") else text
        node = data.get("hydra") if isinstance(data, dict) else None
        if node:
            node.pop("launcher")
            node["runtime"]["choices"].pop("hydra/launcher")
            node["overrides"]["hydra"] = [o for o in node["overrides"]["hydra"] if not o.startswith("hydra/launcher=")]
        out[name] = data
    return out


@pytest.mark.parametrize(
    "app, args",
    [
        ("workdir/my_app.py", ["-m", "a=1,2", "hydra.sweep.subdir=${hydra.job.override_dirname}"]),
        ("structured_defaults/my_app.py", ["-m", "db=mysql,postgresql"]),
    ],
)
def test_a_sweep_under_numarun_matches_hydras_basic_launcher(tmp_path: Path, app: str, args: list[str]) -> None:
    """``numarun APP -m`` (each job through hydra/launcher=numarun, two at a time) makes the run dirs, files and
    output that ``python APP -m`` makes with Hydra's basic launcher."""
    basic, ours = tmp_path / "basic", tmp_path / "numarun"
    basic.mkdir()
    ours.mkdir()
    expected = _run([sys.executable, str(APPS / app), *args], basic)
    got = _run([sys.executable, "-m", "numarun", str(APPS / app), *args], ours)
    assert "hydra/launcher=numarun" in (next(ours.rglob("multirun.yaml"))).read_text()
    printed = [ln for ln in stdout_lines(got, ours) if "[HYDRA]" not in ln]
    assert printed == [ln for ln in stdout_lines(expected, basic) if "[HYDRA]" not in ln] and printed
    assert _without_launcher(tree(ours)) == _without_launcher(tree(basic))

    def made(root: Path, pattern: str) -> list[str]:
        return sorted(STAMP.sub("<ts>", str(p.relative_to(root))) for p in root.rglob(pattern))

    assert made(ours, ".hydra") == made(basic, ".hydra") and len(made(ours, ".hydra")) == 2  # the two run dirs
    assert made(ours, "*.log") == made(basic, "*.log") and len(made(ours, "*.log")) == 2  # each job's log


@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--help"], ["--info"]])
def test_info_commands_create_no_run_dir(tmp_path: Path, flags: list[str]) -> None:
    proc = numarun(tmp_path, APPS / "job_name" / "with_config_file_override.py", *flags)
    assert proc.stdout.strip()
    assert list(tmp_path.iterdir()) == []


def test_every_rank_computes_the_pinned_run_dir_and_only_rank_0_writes(tmp_path: Path) -> None:
    """The worker side alone: the bootstrap with a pinned clock, as rank 1 then rank 0."""
    app = APPS / "workdir" / "my_app.py"
    run = ["hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"]
    env = {**_env(), "NUMARUN_HYDRA_NOW": "2020-01-02T03:04:05"}
    for rank in ("1", "0"):
        proc = subprocess.run(
            [sys.executable, str(ENTRY), str(app), *run],
            check=False,
            cwd=tmp_path,
            env={**env, "RANK": rank},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        run_dir = tmp_path / "outputs" / "2020-01-02" / "03-04-05"
        assert run_dir.is_dir()  # the pinned time, in every rank
        written = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.yaml"))
        assert written == ([] if rank == "1" else [".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"])


RUN_DIR_APP = """
import os
import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base=None, config_path=None)
def main(cfg):
    print("RUNDIR", os.environ["RANK"], HydraConfig.get().runtime.output_dir, flush=True)


main()
"""


def test_nodes_started_seconds_apart_share_one_run_dir(tmp_path: Path) -> None:
    """Two launchers, the second started after the first's clock has moved to another second,
    no clock handed to them: the ranks agree through the job's store on one run dir."""
    import time

    app = tmp_path / "app.py"
    app.write_text(RUN_DIR_APP)
    port = free_port()
    base = [
        sys.executable,
        "-m",
        "numarun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--binding",
        "none",
    ]
    env = {**_env(), "GLOO_SOCKET_IFNAME": "lo"}
    procs = [
        subprocess.Popen(
            [*base, "--node-rank", "0", str(app)],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    ]
    # node 0 has fixed its clock once its store listens; node 1 starts in a later second than that
    wait_until("node 0's store", lambda: listening(port), 120, 0.05, proc=procs[0])
    fixed = int(time.time())
    wait_until("the next second", lambda: int(time.time()) > fixed, 5, 0.05)
    procs.append(
        subprocess.Popen(
            [*base, "--node-rank", "1", str(app)],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    )
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
        outs.append(out)
    dirs = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RUNDIR "):
                _, rank, path = line.split(" ", 2)
                dirs[rank] = path
    assert sorted(dirs) == ["0", "1"] and dirs["0"] == dirs["1"], outs
    assert run_dirs(tmp_path / "outputs") == {Path(dirs["0"])}  # .hydra/ written once, by rank 0
