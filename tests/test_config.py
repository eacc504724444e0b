"""Job configs: composition, validation, run dirs, sweeps (in-process, no workers)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from numarun.config import compose as C
from numarun.config.schema import load_job_config
from numarun.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "scripts" / "train.py")
HYDRA_APP = str(REPO / "tests" / "scripts" / "hydra_app.py")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_overrides_reach_saved_config(in_tmp: Path) -> None:
    ov = ["parallel=fsdp", "model=gpt", "trainer.batch_size=32", "launcher.binding=core-complex", "optim.lr=0.01"]
    job = C.prepare_launch(TRAIN, ov, is_module=False)
    assert job is not None and job.kind is C.AppKind.TRAINER
    assert job.run_dir.parent.parent == in_tmp / "outputs"  # outputs/<date>/<time>
    saved = yaml.safe_load((job.run_dir / "config.yaml").read_text())
    assert saved["parallel"]["kind"] == "fsdp"
    assert saved["model"]["kind"] == "gpt" and saved["model"]["d_model"] == 64
    assert saved["trainer"]["batch_size"] == 32
    assert saved["optim"]["lr"] == 0.01
    assert "hydra" not in saved
    assert yaml.safe_load((job.run_dir / "overrides.yaml").read_text()) == ov
    assert job.launcher["binding"] == "core-complex"
    assert job.env == {"NUMARUN_RUN_DIR": str(job.run_dir), "NUMARUN_CONFIG": str(job.run_dir / "config.yaml")}
    assert job.script_args == ()
    cfg = load_job_config(job.config_file)  # what every rank reads
    assert cfg.trainer.batch_size == 32 and cfg.launcher.binding == "core-complex"


def test_hydra_run_dir_override_and_reuse(in_tmp: Path) -> None:
    target = in_tmp / "runs" / "a"
    job = C.prepare_launch("numarun.train", [f"hydra.run.dir={target}"], is_module=True)
    assert job is not None and job.run_dir == target
    again = C.prepare_launch("numarun.train", [f"hydra.run.dir={target}", "trainer.steps=3"], is_module=True)
    assert again is not None and again.run_dir == target  # an explicit dir is reused, as Hydra does
    assert load_job_config(target / "config.yaml").trainer.steps == 3


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.stepz=3", "trainer.stepz"),
        ("trainer.steps=abc", "trainer.steps"),
        ("model=nope", "model"),
        ("launcher.binding=weird", "launcher.binding"),
        ("trainer.batch_size=-4", "trainer.batch_size"),
        ("+trainer.extra=1", "extra"),
        ("data=tokens", "data.path"),
        ("optim.name=lamb", "optim.name"),
        ("comm.compression=int8", "comm.compression"),
        ("comm.allreduce=ring", "comm.allreduce"),
    ],
)
def test_bad_overrides_fail_before_any_run_dir(in_tmp: Path, override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        C.prepare_launch(TRAIN, [override], is_module=False)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and "expected" in msg
    assert not (in_tmp / "outputs").exists()


def test_bad_override_in_one_sweep_job_stops_all(in_tmp: Path) -> None:
    with pytest.raises(ConfigError):
        C.prepare_sweep(TRAIN, ["-m", "trainer.batch_size=8,-1"], is_module=False)
    assert not (in_tmp / "outputs").exists() and not (in_tmp / "multirun").exists()


def test_expand_sweep_is_the_cartesian_product_in_order() -> None:
    jobs = C.expand_sweep(["a=1,2", "b=x", "c=p,q"])
    assert jobs == [["a=1", "b=x", "c=p"], ["a=1", "b=x", "c=q"], ["a=2", "b=x", "c=p"], ["a=2", "b=x", "c=q"]]
    assert C.expand_sweep(["n=range(0,3)"]) == [["n=0"], ["n=1"], ["n=2"]]
    assert C.expand_sweep([]) == [[]]


def test_multirun_gives_one_run_dir_per_job(in_tmp: Path) -> None:
    jobs = C.prepare_sweep(TRAIN, ["-m", "trainer.batch_size=8,16", "model=mlp,gpt"], is_module=False)
    assert jobs is not None and len(jobs) == 4
    dirs = {j.run_dir for j in jobs}
    assert len(dirs) == 4 and all(d.parent == jobs[0].run_dir.parent for d in dirs)
    seen = {(load_job_config(j.config_file).trainer.batch_size, load_job_config(j.config_file).model.kind) for j in jobs}
    assert seen == {(8, "mlp"), (8, "gpt"), (16, "mlp"), (16, "gpt")}
    with pytest.raises(ConfigError, match="sweep of 2 jobs"):
        C.prepare_launch(TRAIN, ["-m", "trainer.batch_size=8,16"], is_module=False)


def test_dry_run_validates_and_writes_nothing(in_tmp: Path) -> None:
    jobs = C.prepare_sweep(TRAIN, ["trainer.steps=2"], is_module=False, dry_run=True)
    assert jobs is not None and len(jobs) == 1
    assert not (in_tmp / "outputs").exists()
    with pytest.raises(ConfigError):
        C.prepare_sweep(TRAIN, ["trainer.steps=x"], is_module=False, dry_run=True)


def test_planted_symlink_is_not_followed(in_tmp: Path) -> None:
    victim = in_tmp / "victim"
    victim.mkdir()
    link = in_tmp / "run"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        C.prepare_launch(TRAIN, [f"hydra.run.dir={link}"], is_module=False)
    assert list(victim.iterdir()) == []
    # a symlink planted at a file name inside a real run dir is not followed either
    real = in_tmp / "real"
    real.mkdir()
    target_file = in_tmp / "elsewhere.yaml"
    target_file.write_text("keep\n")
    (real / "config.yaml").symlink_to(target_file)
    with pytest.raises(ConfigError, match="symbolic link"):
        C.prepare_launch(TRAIN, [f"hydra.run.dir={real}"], is_module=False)
    assert target_file.read_text() == "keep\n"


def test_run_dir_follows_the_umask(in_tmp: Path) -> None:
    old = os.umask(0o077)
    try:
        job = C.prepare_launch(TRAIN, [], is_module=False)
    finally:
        os.umask(old)
    assert job is not None
    assert (job.run_dir.stat().st_mode & 0o777) == 0o700
    assert (job.config_file.stat().st_mode & 0o777) == 0o600


def test_same_second_default_dirs_do_not_collide(in_tmp: Path) -> None:
    base = in_tmp / "outputs" / "d" / "t"
    first = C.make_run_dir(base, explicit=False)
    second = C.make_run_dir(base, explicit=False)
    assert first == base and second == base.with_name("t_1")


def test_detect_app(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\nprint(sys.argv)\n")
    mine = tmp_path / "mine.py"
    mine.write_text("from numarun.train import main\nmain()\n")
    assert C.detect_app(str(plain), is_module=False) is C.AppKind.PLAIN
    assert C.detect_app(str(mine), is_module=False) is C.AppKind.TRAINER
    assert C.detect_app(TRAIN, is_module=False) is C.AppKind.TRAINER
    assert C.detect_app("numarun.train", is_module=True) is C.AppKind.TRAINER
    assert C.detect_app(HYDRA_APP, is_module=False) is C.AppKind.HYDRA_MAIN
    assert C.prepare_launch(str(plain), ["a=1", "--flag"], is_module=False) is None


def test_user_hydra_app_written_once(in_tmp: Path) -> None:
    job = C.prepare_launch(HYDRA_APP, ["lr=0.5", "optim.momentum=0.25"], is_module=False)
    assert job is not None and job.kind is C.AppKind.HYDRA_MAIN
    saved = yaml.safe_load((job.run_dir / ".hydra" / "config.yaml").read_text())
    assert saved == {"lr": 0.5, "name": "demo", "optim": {"momentum": 0.25}}
    hydra_node = yaml.safe_load((job.run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra_node["run"]["dir"] == str(job.run_dir)
    assert job.script_args == ("lr=0.5", "optim.momentum=0.25", f"hydra.run.dir={job.run_dir}", "hydra.output_subdir=null")
    with pytest.raises(ConfigError, match="nosuch"):
        C.prepare_launch(HYDRA_APP, ["nosuch=1"], is_module=False)


def test_launcher_settings_fill_flags_left_at_default() -> None:
    from numarun.plan.model import BindingMode

    defaults = {"nproc_per_node": None, "binding": BindingMode.EXCLUSIVE, "nnodes": "1:1", "master_port": 29500}
    args = argparse.Namespace(nproc_per_node=None, binding=BindingMode.EXCLUSIVE, nnodes="1:1", master_port=29600)
    applied = C.apply_launcher_settings(
        args, {"nproc_per_node": 2, "binding": "socket", "nnodes": 1, "master_port": 29999}, defaults
    )
    assert args.nproc_per_node == 2 and args.binding is BindingMode.SOCKET and args.nnodes == "1"
    assert args.master_port == 29600  # given on the command line: the flag wins
    assert sorted(applied) == ["binding", "nnodes", "nproc_per_node"]


def test_saved_config_with_unknown_key_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("trainer:\n  nope: 1\n")
    with pytest.raises(ConfigError, match="nope"):
        load_job_config(bad)


@pytest.mark.slow
def test_cli_bad_override_exits_2_with_one_line(in_tmp: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "numarun", TRAIN, "trainer.steps=abc"],
        cwd=in_tmp, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("numarun: error: bad override 'trainer.steps=abc'")
    assert not (in_tmp / "outputs").exists()


@pytest.mark.slow
def test_cli_config_feeds_run_flags_and_sweeps_job_by_job(in_tmp: Path) -> None:
    def dry(*args: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-m", "numarun", "--dry-run", *args], cwd=in_tmp,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [ln for ln in proc.stdout.splitlines() if " torchrun " in ln]

    sweep = dry(TRAIN, "-m", "launcher.nproc_per_node=2", "trainer.steps=1,2")
    assert len(sweep) == 2
    assert all("--nproc-per-node=2" in ln for ln in sweep)
    assert "/0/config.yaml" in sweep[0] and "/1/config.yaml" in sweep[1]
    # a flag on the command line wins over the config's launcher group
    (line,) = dry("--nproc-per-node", "1", TRAIN, "launcher.nproc_per_node=2")
    assert "--nproc-per-node=1" in line
    assert not (in_tmp / "outputs").exists() and not (in_tmp / "multirun").exists()  # dry run: nothing written


def test_configs_ship_inside_the_package() -> None:
    # launcher/configs links to configs/ so that a wheel (package data) carries the same tree
    packaged = REPO / "launcher" / "configs"
    assert packaged.resolve() == (REPO / "configs").resolve()
    assert C.config_dir().resolve() == (REPO / "configs").resolve()


def test_config_write_is_atomic_and_refuses_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    C.write_text_nofollow(target, "a: 1\n")
    C.write_text_nofollow(target, "a: 2\n")  # a second node rewriting the same file
    assert target.read_text() == "a: 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left
    elsewhere = tmp_path / "elsewhere"
    link = tmp_path / "linked.yaml"
    link.symlink_to(elsewhere)
    with pytest.raises(ConfigError):
        C.write_text_nofollow(link, "x\n")
    assert not elsewhere.exists()
