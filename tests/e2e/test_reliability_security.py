"""Security: shell commands built from user input are quoted, run dirs and checkpoints
follow the user's umask, and a symlink planted in the shared output root is refused.

The ``--dry-run`` command line is checked two ways for random hostile strings (``$()``,
backticks, quotes, newlines, ``;``...): ``shlex.split`` gives back the exact argv, and a
real ``bash`` running the printed line hands ``torchrun`` exactly that argv, expanding
nothing. (The sbatch script has its own property test in ``test_slurm_script.py``.)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, SCRIPTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numarun.launch.torchrun import command_line
from numarun.options.torchrun import torchrun_parser

EXIT = str(SCRIPTS / "exit_rank.py")
TRAIN = str(REPO / "scripts" / "train.py")
MARK = "# plan.json: the output of 'numarun plan --json' with the same options\n"

HOSTILE = [
    "$(touch pwned)",
    "\udcff",
    "`touch pwned`",
    "'",
    '"',
    "\n",
    ";",
    "&&",
    "|",
    "\\",
    "$HOME",
    "${X:-y}",
    "*",
    "~",
    " ",
    "\t",
    "!",
    "#",
    ">x",
    "--",
]
# No lone surrogates: an argv or environment cannot hold them (undecodable bytes arrive as
# \udc80-\udcff, like HOSTILE's "\udcff"); NUL cannot be in one either.
words = st.lists(
    st.one_of(
        st.sampled_from(HOSTILE),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
    ),
    min_size=1,
    max_size=4,
).map("".join)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for k in [k for k in os.environ if k.startswith(("NUMARUN_", "PET_", "SLURM_"))] + [
        "CUDA_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
    ]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _dry_run(args: list[str]) -> str:
    from numarun.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--dry-run", "--nproc-per-node", "1", EXIT, *args]) == 0
    text = out.getvalue()
    assert MARK in text
    return text.split(MARK, 1)[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(words, max_size=4))
def test_dry_run_command_splits_back_to_the_argv(args: list[str], clean_env: Path) -> None:
    command = _dry_run(args)
    split = shlex.split(command)
    i = split.index("torchrun")
    # the script's arguments as torchrun itself reads them (it drops a '--' right after the script)
    want = torchrun_parser().parse_args([EXIT, *args]).training_script_args
    assert split[i + 1 :][len(split) - i - 2 - len(want) :] == [EXIT, *want]
    assert all("=" in w for w in split[:i])  # only VAR=value words before torchrun
    assert list(clean_env.iterdir()) == []  # nothing ran, nothing was written


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(args=st.lists(words, max_size=3), value=words)
def test_bash_runs_the_printed_command_with_the_exact_argv(
    args: list[str], value: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    where = tmp_path_factory.mktemp("sh")
    line = command_line({"NUMARUN_PLAN": value, "X": "1"}, ["--nproc-per-node=1", EXIT, *args])
    # torchrun replaced by a function printing its argv (NUL-separated) and one variable
    script = 'torchrun() { printf "%s\\0" "$NUMARUN_PLAN" "$@"; }\n' + line + "\n"
    r = subprocess.run(["bash", "-c", script], cwd=where, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = r.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    assert got == [value, "--nproc-per-node=1", EXIT, *args]
    assert list(where.iterdir()) == []  # no command substitution ran


def _cli(*args: str) -> tuple[int, str]:
    from numarun.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return code, err.getvalue()


@pytest.mark.parametrize("planted", ["outputs", "outputs/<date>"])
def test_planted_symlink_in_the_output_root_is_refused(planted: str, clean_env: Path) -> None:
    elsewhere = clean_env.parent / f"{clean_env.name}-elsewhere"
    elsewhere.mkdir()
    link = clean_env / planted.replace("<date>", dt.datetime.now().strftime("%Y-%m-%d"))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    code, err = _cli("--nproc-per-node", "1", TRAIN, "trainer.steps=1")
    assert code == 2 and len(err.splitlines()) == 1 and "symbolic link" in err, err
    assert str(link) in err
    assert list(elsewhere.rglob("*")) == []  # nothing written through the link


def test_run_dir_planted_as_symlink_is_refused(clean_env: Path) -> None:
    elsewhere = clean_env.parent / f"{clean_env.name}-victim"
    elsewhere.mkdir()
    (clean_env / "run").symlink_to(elsewhere)
    code, err = _cli("--nproc-per-node", "1", TRAIN, f"hydra.run.dir={clean_env / 'run'}")
    assert code == 2 and len(err.splitlines()) == 1 and "symbolic link" in err, err
    assert list(elsewhere.iterdir()) == []


def _modes(root: Path) -> set[tuple[str, int]]:
    return {("d" if p.is_dir() else "f", p.stat().st_mode & 0o777) for p in [root, *root.rglob("*")]}


def test_run_dir_follows_umask_027(clean_env: Path) -> None:
    from numarun.config.compose import prepare_launch

    old = os.umask(0o027)
    try:
        job = prepare_launch(["trainer.steps=1"])
    finally:
        os.umask(old)
    assert job is not None
    assert _modes(job.run_dir) == {("d", 0o750), ("f", 0o640)}
    # the default outputs/<date> parents too
    assert (clean_env / "outputs").stat().st_mode & 0o777 == 0o750


def test_checkpoint_follows_umask_027(tmp_path: Path) -> None:
    import torch
    import torch.distributed as dist

    from numarun.train import checkpoint

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    old = os.umask(0o027)
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = checkpoint.save(tmp_path / "ckpt", 3, model, opt, meta={"world_size": 1}, rank=0)
    finally:
        os.umask(old)
        dist.destroy_process_group()
    assert path.name == "step_00000003"
    assert _modes(tmp_path / "ckpt") == {("d", 0o750), ("f", 0o640)}
