"""The wheel as users install it: built from the sdist, installed alone into its own venv, run
from a directory that is not the checkout.

The working directory holds decoy ``launcher/`` and ``numarun/`` packages whose import raises,
so any code that imports numarun (or its source folder's name) from the working directory
instead of the installed wheel fails loudly. The venv (no system site-packages, torch from the
CPU wheel) is kept between runs in ``$NUMARUN_WHEEL_VENV`` (default ``.venv-wheel/``); numarun
itself is uninstalled and the freshly built wheel installed every run.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

VENV = Path(os.environ.get("NUMARUN_WHEEL_VENV", REPO / ".venv-wheel"))
TORCH = "torch==2.13.0"
"""What scripts/setup.sh installs on a machine without an NVIDIA driver (the CPU build here)."""

DECOY = 'raise RuntimeError("decoy {name}/ in the working directory was imported")\n'

ALLREDUCE = """\
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import numarun

ctx = numarun.init()
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
Path(sys.argv[1], f"rank{dist.get_rank()}").write_text(
    f"rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g} backend {dist.get_backend()} "
    f"from {numarun.__file__}")
dist.destroy_process_group()
"""


def _run(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{argv} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


def _user_env() -> dict[str, str]:
    """A user's shell: the venv's bin first, nothing of the checkout or the test run."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NUMARUN_", "PYTHON", "VIRTUAL_ENV", "PYTEST_", "TORCHELASTIC_"))
    }
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks (gloo) even on a GPU host
    return env


@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from that sdist (so both are checked)."""
    out = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], cwd=REPO)
    log = proc.stdout + proc.stderr
    # current setuptools' complaints about the project's metadata or layout
    for complaint in (
        "absent from the `packages` configuration",
        "SetuptoolsDeprecationWarning",
        "License classifiers",
    ):
        assert complaint not in log, log
    return out


def _one(directory: Path, pattern: str) -> Path:
    found = sorted(directory.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {directory}, found {found}"
    return found[0]


def _checkout_configs() -> set[str]:
    return {p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml")}


def test_wheel_holds_configs_template_and_entry_as_real_files(dist_dir):
    wheel = zipfile.ZipFile(_one(dist_dir, "numarun-*.whl"))
    infos = {i.filename: i for i in wheel.infolist()}
    configs = {n.removeprefix("numarun/configs/") for n in infos if n.startswith("numarun/configs/")}
    assert configs == _checkout_configs()
    for name in (
        "numarun/slurm/templates/sbatch.sh.in",
        "numarun/worker/entry.py",
        "numarun/py.typed",
        "numarun/configs/config.yaml",
    ):
        assert name in infos, name
    # a symlink stored in a zip has S_IFLNK in the high bits of external_attr
    links = [n for n, i in infos.items() if stat.S_ISLNK(i.external_attr >> 16)]
    assert links == []
    assert not any(n.startswith(("launcher/", "configs/", "tests/")) for n in infos), "only the numarun package"
    # Hydra's launcher plugin, in Hydra's namespace package (no __init__.py of its own there)
    assert "hydra_plugins/numarun_launcher/numarun_launcher.py" in infos and "hydra_plugins/__init__.py" not in infos
    licenses = [n for n in infos if ".dist-info/licenses/" in n]
    assert [n.rsplit("/", 1)[1] for n in licenses] == ["LICENSE"], licenses  # the Apache-2.0 text pyproject names
    assert "Apache License" in wheel.read(licenses[0]).decode()
    templ = wheel.read("numarun/slurm/templates/sbatch.sh.in").decode()
    assert templ == (REPO / "launcher/slurm/templates/sbatch.sh.in").read_text()


def test_sdist_holds_configs_as_real_files(dist_dir):
    sdist = _one(dist_dir, "numarun-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
    configs = {
        n.removeprefix("launcher/configs/")
        for n, m in members.items()
        if n.startswith("launcher/configs/") and n.endswith(".yaml")
    }
    assert configs == _checkout_configs()
    assert all(m.isfile() for n, m in members.items() if n.startswith("launcher/configs/") and n.endswith(".yaml"))
    assert not [n for n, m in members.items() if m.issym() or m.islnk()]
    assert "launcher/slurm/templates/sbatch.sh.in" in members
    for name in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "tests/conftest.py",
        "scripts/test.sh",
        "configs/config.yaml",
    ):
        assert name in members, f"{name} missing from the sdist"


@pytest.fixture(scope="module")
def venv(dist_dir) -> Path:
    """The cached venv with this build's wheel installed (and nothing of the checkout)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(VENV)], cwd=REPO)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        _run(pip + ["install", "-q", TORCH], cwd=REPO)
    subprocess.run(pip + ["uninstall", "-q", "-y", "numarun"], capture_output=True)
    _run(pip + ["install", "-q", str(_one(dist_dir, "numarun-*.whl"))], cwd=REPO)
    return VENV


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """Not the checkout; holds decoy ``launcher/`` and ``numarun/`` packages and the user's script."""
    work = tmp_path_factory.mktemp("user-project")
    for name in ("launcher", "numarun"):
        (work / name).mkdir()
        (work / name / "__init__.py").write_text(DECOY.format(name=name))
    (work / "allreduce.py").write_text(ALLREDUCE)
    return work


def _site_packages(venv: Path) -> Path:
    out = _run(
        [str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=venv,
        env=_user_env(),
    )
    return Path(out.stdout.strip())


def test_installed_numarun_is_the_wheel(venv, workdir):
    out = _run(["numarun", "--version"], cwd=workdir, env=_user_env())
    assert out.stdout.strip() == "numarun 0.2.0"
    # a stray top-level 'configs' folder in site-packages (some other distribution's) is not numarun's
    site = _site_packages(venv)
    stray = site / "configs"
    assert not stray.exists()
    stray.mkdir()
    try:
        (stray / "config.yaml").write_text("{}\n")
        where = _run(
            [str(venv / "bin/python"), "-c", "import numarun.config.compose as c; print(c.config_dir())"],
            cwd=venv,
            env=_user_env(),
        )
    finally:
        (stray / "config.yaml").unlink()
        stray.rmdir()
    assert Path(where.stdout.strip()) == site / "numarun" / "configs"


def test_python_m_numarun_two_gloo_ranks(venv, workdir, tmp_path):
    """``python -m numarun`` from a folder holding ``launcher/``; the script's folder holds both decoys.

    (A folder named ``numarun`` in the working directory is what ``python -m numarun`` itself
    imports, by Python's rule for ``-m``; the workers must not, and they run from ``workdir``'s
    script path with ``sys.path[0]`` set there.)
    """
    cwd = tmp_path / "other-project"
    (cwd / "launcher").mkdir(parents=True)
    (cwd / "launcher" / "__init__.py").write_text(DECOY.format(name="launcher"))
    out = tmp_path / "ranks"
    out.mkdir()
    _run(
        [str(venv / "bin/python"), "-m", "numarun", "--nproc-per-node", "2", str(workdir / "allreduce.py"), str(out)],
        cwd=cwd,
        env=_user_env(),
    )
    lines = [(out / f"rank{r}").read_text() for r in range(2)]
    site = _site_packages(venv)
    assert [line.split(" from ")[0] for line in lines] == ["rank 0/2 sum 3 backend gloo", "rank 1/2 sum 3 backend gloo"]
    assert all(line.split(" from ")[1] == str(site / "numarun" / "__init__.py") for line in lines), lines


def test_numarun_command_from_decoy_folder(venv, workdir, tmp_path):
    _run(["numarun", "--nproc-per-node", "2", "allreduce.py", str(tmp_path)], cwd=workdir, env=_user_env())
    site = _site_packages(venv)
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == [
        f"rank {r}/2 sum 3 backend gloo from {site / 'numarun' / '__init__.py'}" for r in range(2)
    ]


def test_trainer_with_packaged_configs(venv, workdir):
    run_dir = workdir / "outputs" / "train"
    _run(
        [
            "numarun",
            "-m",
            "numarun.train",
            "launcher=cpu2",
            "model=mlp",
            "parallel=ddp",
            "trainer.steps=3",
            "trainer.progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=workdir,
        env=_user_env(),
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_done"] == 3 and summary["world_size"] == 2, summary
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and metrics[-1]["step"] == 3
    assert "model" in (run_dir / "config.yaml").read_text()


def _check_sbatch(text: str, target: str) -> None:
    assert text.startswith("#!"), text[:200]
    assert "#SBATCH --nodes=2" in text
    assert target in text and "trainer.steps=3" in text


def test_submit_dry_run_renders_the_packaged_template(venv, workdir):
    """A user's own trainer script (the form ``numarun submit`` takes today)."""
    (workdir / "my_train.py").write_text("from numarun.train import main\n\nmain()\n")
    out = _run(
        ["numarun", "submit", "--dry-run", "--nodes", "2", "--nproc-per-node", "2", "my_train.py", "trainer.steps=3"],
        cwd=workdir,
        env=_user_env(),
    )
    _check_sbatch(out.stdout, "my_train.py")
    assert not (workdir / "outputs" / "slurm").exists(), "a dry run writes nothing"


def test_submit_dry_run_module_trainer(venv, workdir):
    out = _run(
        [
            "numarun",
            "submit",
            "--dry-run",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "-m",
            "numarun.train",
            "trainer.steps=3",
        ],
        cwd=workdir,
        env=_user_env(),
    )
    _check_sbatch(out.stdout, "numarun.train")


SWEEP_APP = """\
import os
from pathlib import Path

import hydra


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def job(cfg):
    Path(cfg.out, f"job{cfg.x}.rank{os.environ['RANK']}").write_text(os.environ["WORLD_SIZE"])


if __name__ == "__main__":
    job()
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_installed_hydra_finds_the_launcher_plugin(venv, workdir, tmp_path, ranks):
    """A sweep of ``hydra/launcher=numarun`` from the decoys' folder: one-rank jobs (the rank started
    directly) and two-rank jobs (a ``numarun run`` each)."""
    (tmp_path / "sweep_app.py").write_text(SWEEP_APP)
    _run(
        [
            str(venv / "bin/python"),
            str(tmp_path / "sweep_app.py"),
            "-m",
            "hydra/launcher=numarun",
            f"+out={tmp_path}",
            "+x=1,2",
            f"hydra.launcher.nproc_per_node={ranks}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        cwd=workdir,
        env=_user_env(),
    )
    got = sorted(p.name for p in tmp_path.glob("job*"))
    assert got == sorted(f"job{x}.rank{r}" for x in (1, 2) for r in range(ranks))
