"""numarun's trainer config: composed by Hydra once per job, Hydra's commands and files, run dirs, sweeps."""

from __future__ import annotations

import ast
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, SCRIPTS

from numarun.config import compose as C
from numarun.config import rundir
from numarun.config.detect import AppKind, detect_app
from numarun.config.schema import load_job_config
from numarun.errors import ConfigError

TRAIN = str(REPO / "scripts" / "train.py")
HYDRA_APP = str(SCRIPTS / "hydra_app.py")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_overrides_reach_saved_config(in_tmp: Path) -> None:
    ov = ["parallel=fsdp", "model=gpt", "trainer.batch_size=32", "launcher.binding=core-complex", "optim.lr=0.01"]
    job = C.prepare_launch(ov)
    assert job.run_dir.parent.parent == in_tmp / "outputs"  # outputs/<date>/<time>
    saved = yaml.safe_load((job.run_dir / "config.yaml").read_text())
    assert saved["parallel"]["kind"] == "fsdp"
    assert saved["model"]["kind"] == "gpt" and saved["model"]["d_model"] == 64
    assert saved["trainer"]["batch_size"] == 32 and saved["optim"]["lr"] == 0.01
    assert "hydra" not in saved
    # Hydra's own record, as any Hydra app has it
    hydra_dir = job.run_dir / ".hydra"
    assert sorted(p.name for p in hydra_dir.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) == ov
    hydra_node = yaml.safe_load((hydra_dir / "hydra.yaml").read_text())["hydra"]
    assert hydra_node["job"]["name"] == "train" and hydra_node["mode"] == "RUN"
    assert hydra_node["runtime"]["output_dir"] == str(job.run_dir)
    assert job.launcher["binding"] == "core-complex"
    assert job.env == {"NUMARUN_RUN_DIR": str(job.run_dir), "NUMARUN_CONFIG": str(job.run_dir / "config.yaml")}
    cfg = load_job_config(job.config_file)  # what every rank reads
    assert cfg.trainer.batch_size == 32 and cfg.launcher.binding == "core-complex"


def test_hydra_interpolations_resolve_in_the_saved_config(in_tmp: Path) -> None:
    job = C.prepare_launch(["trainer.checkpoint_dir=${hydra:runtime.output_dir}/ck", "data.path=${hydra:job.name}.bin"])
    cfg = load_job_config(job.config_file)
    assert cfg.trainer.checkpoint_dir == f"{job.run_dir}/ck" and cfg.data.path == "train.bin"


def test_hydra_run_dir_override_and_reuse(in_tmp: Path) -> None:
    target = in_tmp / "runs" / "a"
    job = C.prepare_launch([f"hydra.run.dir={target}"])
    assert job.run_dir == target
    again = C.prepare_launch([f"hydra.run.dir={target}", "trainer.steps=3"])
    assert again.run_dir == target  # an existing dir is reused, as Hydra does
    assert load_job_config(target / "config.yaml").trainer.steps == 3
    here = C.prepare_launch(["hydra.run.dir=./"])
    assert here.run_dir == in_tmp and (in_tmp / ".hydra" / "config.yaml").is_file()


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
        ("optim.kind=lamb", "optim.kind"),
        ("optim.name=adamw", "optim.name"),  # the old spelling is gone: kind, as in every group
        ("comm.compression=int8", "comm.compression"),
        ("comm.allreduce=ring", "comm.allreduce"),
    ],
)
def test_bad_overrides_fail_before_any_run_dir(in_tmp: Path, override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        C.prepare_launch([override])
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and "expected" in msg
    assert list(in_tmp.iterdir()) == []


def test_bad_value_in_one_sweep_job_runs_nothing(in_tmp: Path) -> None:
    ran: list[object] = []
    for bad in (["-m", "trainer.batch_size=8,-1"], ["-m", "trainer.steps=1,x"]):
        with pytest.raises(ConfigError):
            C.run_hydra(bad, ran.append)
    assert ran == [] and list(in_tmp.iterdir()) == []


def test_sweep_parameter_of_hydra_itself_is_one_line(in_tmp: Path) -> None:
    with pytest.raises(ConfigError, match="hydra.sweeper.params.a"):
        C.run_hydra(["-m", "+hydra.sweeper.params.a=1,2"], lambda job: None)


def test_expand_sweep_is_the_cartesian_product_in_order() -> None:
    jobs = C.expand_sweep(["a=1,2", "b=x", "c=p,q"])
    assert jobs == [["a=1", "b=x", "c=p"], ["a=1", "b=x", "c=q"], ["a=2", "b=x", "c=p"], ["a=2", "b=x", "c=q"]]
    assert C.expand_sweep(["n=range(0,3)"]) == [["n=0"], ["n=1"], ["n=2"]]
    assert C.expand_sweep([]) == [[]]


def test_multirun_is_hydras_sweep(in_tmp: Path) -> None:
    jobs: list[C.PreparedJob] = []
    C.run_hydra(["-m", "trainer.batch_size=8,16", "model=mlp,gpt"], jobs.append)
    assert len(jobs) == 4
    sweep_dir = jobs[0].run_dir.parent
    assert [j.run_dir for j in jobs] == [sweep_dir / str(n) for n in range(4)]  # hydra.job.num
    assert (sweep_dir / "multirun.yaml").is_file()
    seen = [
        (load_job_config(j.config_file).trainer.batch_size, load_job_config(j.config_file).model.kind) for j in jobs
    ]
    assert seen == [(8, "mlp"), (8, "gpt"), (16, "mlp"), (16, "gpt")]
    hydra_node = yaml.safe_load((jobs[3].run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra_node["mode"] == "MULTIRUN" and hydra_node["job"]["num"] == 3
    with pytest.raises(ConfigError, match="sweep"):
        C.prepare_launch(["-m", "trainer.batch_size=8,16"])


class Recorder:
    """A Hydra callback (``hydra.callbacks``) that records when Hydra calls it."""

    events: list[str] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda **_kwargs: Recorder.events.append(name)


def test_callbacks_are_called_as_hydra_calls_them(in_tmp: Path) -> None:
    Recorder.events.clear()
    callback = f"+hydra.callbacks.rec._target_={__name__}.Recorder"
    C.run_hydra([callback, "trainer.steps=1"], lambda job: None)
    assert Recorder.events == ["on_run_start", "on_job_start", "on_job_end", "on_run_end"]
    Recorder.events.clear()
    C.run_hydra(["-m", callback, "trainer.steps=1,2"], lambda job: None)
    assert Recorder.events == ["on_multirun_start", *["on_job_start", "on_job_end"] * 2, "on_multirun_end"]


def test_a_failed_job_does_not_stop_the_sweep_but_a_signal_does(in_tmp: Path) -> None:
    from numarun.errors import RunFailed

    ran: list[str] = []

    def fail_first(job: C.PreparedJob) -> None:
        ran.append(job.run_dir.name)
        if len(ran) == 1:
            raise RunFailed("bad run: rank 0 exited with 3", 3)

    with pytest.raises(RunFailed, match="rank 0"):  # raised once every job ran, as Hydra's sweeper does
        C.run_hydra(["-m", "trainer.steps=1,2,3"], fail_first)
    assert ran == ["0", "1", "2"]
    ran.clear()

    def stopped(job: C.PreparedJob) -> None:
        ran.append(job.run_dir.name)
        raise RunFailed("numarun stopped by SIGTERM", 143)

    with pytest.raises(RunFailed, match="SIGTERM"):
        C.run_hydra(["-m", "trainer.steps=1,2,3"], stopped)
    assert ran == ["0"]


def test_sweeper_params_of_the_config_are_swept(in_tmp: Path) -> None:
    extra = in_tmp / "extra"
    extra.mkdir()
    (extra / "mine.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n      trainer.steps: 1,2\n"
    )
    jobs: list[C.PreparedJob] = []
    C.run_hydra(["-cd", str(extra), "-cn", "mine", "-m", "model=mlp,gpt"], jobs.append)
    seen = [(load_job_config(j.config_file).trainer.steps, load_job_config(j.config_file).model.kind) for j in jobs]
    assert seen == [(1, "mlp"), (1, "gpt"), (2, "mlp"), (2, "gpt")]  # the config's params first, as Hydra's sweeper


def test_another_sweeper_runs_as_hydra_runs_it(in_tmp: Path) -> None:
    """Optuna's sweeper with Hydra's basic launcher: each trial composed, checked, saved and run in turn."""
    jobs: list[C.PreparedJob] = []
    checked: list[Path] = []
    args = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "trainer.steps=range(1,4)"]
    C.run_hydra(
        args,
        lambda job: jobs.append(job) or float(load_job_config(job.config_file).trainer.steps),
        lambda job: checked.append(job.run_dir),
    )
    assert [j.run_dir.name for j in jobs] == ["0", "1", "2"] and checked == [j.run_dir for j in jobs]
    assert all(1 <= load_job_config(j.config_file).trainer.steps <= 4 for j in jobs)  # Optuna's range is inclusive
    assert (jobs[0].run_dir.parent / "optimization_results.yaml").is_file()


@pytest.mark.parametrize("group", ["sweeper", "launcher"])
def test_a_plugin_hydra_cannot_load_is_one_line(in_tmp: Path, group: str) -> None:
    with pytest.raises(ConfigError, match="elsewhere.Plugin") as e:
        C.run_hydra(["-m", f"hydra.{group}._target_=elsewhere.Plugin", "trainer.steps=1,2"], lambda job: None)
    assert "\n" not in str(e.value) and list(in_tmp.rglob("*.yaml")) == []


def _count_compositions(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[tuple[str, ...]]:
    """How often Hydra composes each set of the job's own overrides from here on (``hydra.*`` ones left
    out; a sweep's own config counted under its sweep overrides). A spy: Hydra still composes."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls: collections.Counter[tuple[str, ...]] = collections.Counter()
    real = ConfigLoaderImpl.load_configuration

    def load_configuration(self, config_name, overrides, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls[tuple(o for o in overrides if not o.lstrip("+~").startswith("hydra."))] += 1
        return real(self, config_name, overrides, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", load_configuration)
    return calls


def test_every_job_is_composed_once(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_compositions(monkeypatch)
    C.run_hydra(["-m", "trainer.steps=1,2,3"], lambda job: None, lambda job: None)
    # Hydra's mode probe and the sweep's own config, then each job once
    assert calls == {
        ("trainer.steps=1,2,3",): 2,
        ("trainer.steps=1",): 1,
        ("trainer.steps=2",): 1,
        ("trainer.steps=3",): 1,
    }
    calls.clear()
    C.run_hydra(["trainer.steps=1"], lambda job: None, lambda job: None)
    assert calls == {("trainer.steps=1",): 2}  # the mode probe, then the job


def test_submit_composes_every_job_once(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.cli import build_parser
    from numarun.commands.submit import build_job

    calls = _count_compositions(monkeypatch)
    args = build_parser("submit").parse_args(
        ["submit", "--dry-run", "--gpus-per-node", "1", TRAIN, "-m", "trainer.steps=1,2,3", "slurm.partition=a,b"]
    )
    job = build_job(args)
    assert job.options.partition == "a"  # the first job's
    each = [(f"trainer.steps={n}", f"slurm.partition={p}") for n in (1, 2, 3) for p in "ab"]
    assert [s[:2] for s in job.arg_sets] == each
    assert calls == {("trainer.steps=1,2,3", "slurm.partition=a,b"): 2, **{e: 1 for e in each}}


def test_sweep_subdir_override_dirname(in_tmp: Path) -> None:
    jobs: list[C.PreparedJob] = []
    C.run_hydra(["-m", "trainer.steps=1,2", "hydra.sweep.subdir=${hydra.job.override_dirname}"], jobs.append)
    assert [j.run_dir.name for j in jobs] == ["trainer.steps=1", "trainer.steps=2"]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--cfg", "job"], "trainer:"),
        (["--cfg", "hydra"], "run:"),
        (["--cfg", "all", "-p", "optim"], "kind: adamw"),
        (["--info"], "Config search path"),
        (["--help"], "Configuration groups"),
        (["-cn", "config", "--cfg", "job", "optim=sgd"], "kind: sgd"),
    ],
)
def test_hydra_commands_print_and_create_no_run_dir(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    C.run_hydra(flags, lambda job: pytest.fail("no job runs"))
    assert needle in capsys.readouterr().out
    assert list(in_tmp.iterdir()) == []


def test_config_path_and_dir_flags(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = in_tmp / "extra" / "optim"
    extra.mkdir(parents=True)
    (extra / "mine.yaml").write_text("kind: sgd\nlr: 0.5\n")
    C.run_hydra(["-cd", str(in_tmp / "extra"), "optim=mine", "--cfg", "job", "-p", "optim"], lambda job: None)
    assert "lr: 0.5" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="nosuch"):
        C.run_hydra(["-cp", "nosuch", "--cfg", "job"], lambda job: None)
    with pytest.raises(ConfigError, match="alt"):
        C.run_hydra(["-cn", "alt"], lambda job: None)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["extra"]


def test_dry_run_validates_and_writes_nothing(in_tmp: Path) -> None:
    jobs = C.compose_dry(["trainer.steps=2", "trainer.checkpoint_dir=${hydra:runtime.output_dir}/ck"])
    ((run_dir, job),) = jobs
    assert run_dir.parent.parent == in_tmp / "outputs"
    assert f"checkpoint_dir: {run_dir}/ck" in job.config_text
    assert list(in_tmp.iterdir()) == []
    sweep = C.compose_dry(["-m", "trainer.steps=1,2", "hydra.sweep.subdir=${hydra.job.override_dirname}"])
    assert [d.name for d, _ in sweep] == ["trainer.steps=1", "trainer.steps=2"]
    with pytest.raises(ConfigError):
        C.compose_dry(["trainer.steps=x"])
    assert list(in_tmp.iterdir()) == []


def test_planted_symlink_is_not_followed(in_tmp: Path) -> None:
    victim = in_tmp / "victim"
    victim.mkdir()
    link = in_tmp / "run"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        C.prepare_launch([f"hydra.run.dir={link}"])
    assert list(victim.iterdir()) == []
    # a link planted as the default outputs/ root
    (in_tmp / "outputs").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        C.prepare_launch([])
    assert list(victim.iterdir()) == []
    # a symlink planted at a file name inside a real run dir is not followed either
    real = in_tmp / "real"
    real.mkdir()
    target_file = in_tmp / "elsewhere.yaml"
    target_file.write_text("keep\n")
    (real / "config.yaml").symlink_to(target_file)
    with pytest.raises(ConfigError, match="symbolic link"):
        C.prepare_launch([f"hydra.run.dir={real}"])
    assert target_file.read_text() == "keep\n"


def test_run_dir_follows_the_umask(in_tmp: Path) -> None:
    old = os.umask(0o077)
    try:
        job = C.prepare_launch([])
    finally:
        os.umask(old)
    assert (job.run_dir.stat().st_mode & 0o777) == 0o700
    assert (job.config_file.stat().st_mode & 0o777) == 0o600


def test_detect_app(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import sys\nprint(sys.argv)\n")
    mine = tmp_path / "mine.py"
    mine.write_text("from numarun.train import main\nmain()\n")
    assert detect_app(str(plain), is_module=False) is AppKind.PLAIN
    assert detect_app(str(mine), is_module=False) is AppKind.TRAINER
    assert detect_app(TRAIN, is_module=False) is AppKind.TRAINER
    assert detect_app("numarun.train", is_module=True) is AppKind.TRAINER
    assert detect_app(HYDRA_APP, is_module=False) is AppKind.HYDRA_MAIN


@pytest.mark.parametrize(
    ("source", "trainer"),
    [
        ("from numarun.train import exit_now, main\nexit_now(main())\n", True),
        ("import numarun.train\nnumarun.train.main()\n", True),
        ("import numarun.train as t\nt.main()\n", True),
        ("from numarun import train\ntrain.main()\n", True),
        ("from numarun.train import *\nmain()\n", True),
        ("from numarun.train import main\nmain(\n", True),  # unparsable: read as text
        # borrowing parts of the trainer makes a script of one's own
        ("from numarun.train.models import Gpt\nimport numarun\nnumarun.init()\n", False),
        ("import numarun.train.models\nprint(numarun.train.models.Gpt)\n", False),
        ("from numarun.train import models\n", False),
        ("# see numarun.train for the trainer\nprint('hi')\n", False),
    ],
)
def test_only_a_script_that_runs_the_trainer_is_the_trainer(tmp_path: Path, source: str, trainer: bool) -> None:
    script = tmp_path / "script.py"
    script.write_text(source)
    assert (detect_app(str(script), is_module=False) is AppKind.TRAINER) is trainer


def test_saved_config_with_unknown_key_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("trainer:\n  nope: 1\n")
    with pytest.raises(ConfigError, match="nope"):
        load_job_config(bad)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
@pytest.mark.parametrize("args", [["trainer.steps=abc"], ["-m", "+hydra.sweeper.params.a=1,2"], ["-cn", "nosuch"]])
def test_cli_bad_override_exits_2_with_one_line(in_tmp: Path, args: list[str]) -> None:
    proc = _cli(in_tmp, TRAIN, *args)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("numarun: error: bad "), proc.stderr
    assert list(in_tmp.iterdir()) == []


@pytest.mark.slow
def test_cli_config_feeds_run_flags_and_sweeps_job_by_job(in_tmp: Path) -> None:
    def dry(*args: str) -> str:
        proc = _cli(in_tmp, "--dry-run", *args)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = dry(TRAIN, "-m", "launcher.nproc_per_node=2", "trainer.steps=1,2")
    sweep = [ln for ln in out.splitlines() if " torchrun " in ln]
    assert len(sweep) == 2 and all("--nproc-per-node=2" in ln for ln in sweep)
    assert "/0/config.yaml" in sweep[0] and "/1/config.yaml" in sweep[1]
    # the dry run says what a real run would create, and shows the composed config
    assert out.count("# a real run would create ") == 2 and "#     steps: 2" in out
    # a flag on the command line wins over the config's launcher group
    (line,) = [
        ln for ln in dry("--nproc-per-node", "1", TRAIN, "launcher.nproc_per_node=2").splitlines() if " torchrun " in ln
    ]
    assert "--nproc-per-node=1" in line
    assert list(in_tmp.iterdir()) == []  # dry run: nothing written


def _numarun_packages(node: ast.AST) -> list[str]:
    """The numarun packages an import statement reaches (``from ..train import x`` -> train)."""
    if isinstance(node, ast.ImportFrom) and node.level >= 2:
        return [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("numarun."):
        return [(node.module or "").split(".")[1]]
    if isinstance(node, ast.Import):
        return [a.name.split(".")[1] for a in node.names if a.name.startswith("numarun.")]
    return []


def test_config_imports_no_layer_above_it() -> None:
    """config/ sits below the trainer and the commands: the trainer's checks are handed to it, never imported."""
    above = {"train", "commands", "slurm", "doctor", "tune", "bench", "view", "cli"}
    found = [
        f"{path.name}:{node.lineno}: {package}"
        for path in sorted((REPO / "launcher" / "config").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        for package in _numarun_packages(node)
        if package in above
    ]
    assert found == []


def test_configs_ship_inside_the_package() -> None:
    # launcher/configs links to configs/ so that a wheel (package data) carries the same tree
    packaged = REPO / "launcher" / "configs"
    assert packaged.resolve() == (REPO / "configs").resolve()
    assert C.config_dir().resolve() == (REPO / "configs").resolve()


def test_config_write_is_atomic_and_refuses_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "config.yaml"
    rundir.write_text_nofollow(target, "a: 1\n")
    rundir.write_text_nofollow(target, "a: 2\n")  # a second node rewriting the same file
    assert target.read_text() == "a: 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left
    elsewhere = tmp_path / "elsewhere"
    link = tmp_path / "linked.yaml"
    link.symlink_to(elsewhere)
    with pytest.raises(ConfigError):
        rundir.write_text_nofollow(link, "x\n")
    assert not elsewhere.exists()


def test_adamw_takes_the_fast_path_except_under_tp() -> None:
    from numarun.train.optim import adamw_path

    assert adamw_path(tp=2, device_type="cuda") == {"foreach": False} == adamw_path(tp=4, device_type="cpu")
    assert adamw_path(tp=1, device_type="cuda") == {"fused": True} == adamw_path(tp=1, device_type="cpu")
    assert adamw_path(tp=1, device_type="mps") == {}


def test_the_fused_cpu_adamw_trains_like_torchs_default() -> None:
    import torch

    from numarun.train.optim import adamw_path

    def train(options: dict[str, bool]) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **options)
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            opt.zero_grad()
            torch.nn.functional.mse_loss(
                model(torch.randn(8, 7, generator=g)), torch.randn(8, 2, generator=g)
            ).backward()
            opt.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    fast = adamw_path(tp=1, device_type="cpu")
    assert fast == {"fused": True}
    assert torch.allclose(train(fast), train({}), rtol=1e-5, atol=1e-6)


def test_check_sees_every_job_before_any_run_dir(in_tmp: Path) -> None:
    from numarun.errors import UsageError

    ran: list[object] = []
    seen: list[str] = []

    def check(job: C.PreparedJob) -> None:
        seen.append(job.run_dir.name)
        if len(seen) == 2:
            raise UsageError("bad plan: impossible")

    with pytest.raises(UsageError):
        C.run_hydra(["-m", "trainer.steps=1,2"], ran.append, check)
    assert seen == ["0", "1"] and ran == [] and list(in_tmp.iterdir()) == []

    def refuse(job: C.PreparedJob) -> None:
        raise UsageError("bad plan: impossible")

    with pytest.raises(UsageError):
        C.run_hydra(["trainer.steps=1"], ran.append, refuse)
    assert ran == [] and list(in_tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("comm.bucket_mb=0", "bad comm.bucket_mb 0"),
        ("comm.bucket_mb=-4", "bad comm.bucket_mb -4"),
        ("comm.chunk_mb=-1", "bad comm.chunk_mb -1"),
    ],
)
def test_comm_sizes_are_checked(override: str, message: str) -> None:
    from numarun.config.schema import check_values

    with pytest.raises(ConfigError, match=message):
        check_values(C.compose([override]))


def test_comm_chunk_mb_zero_means_one_shot_and_is_accepted() -> None:
    from numarun.config.schema import check_values

    cfg = C.compose(["comm=hierarchical", "comm.chunk_mb=0", "comm.bucket_mb=2.5"])
    check_values(cfg)
    assert cfg.comm.chunk_mb == 0 and cfg.comm.bucket_mb == 2.5
