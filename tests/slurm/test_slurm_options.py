"""SLURM option validation: the accepted forms, and bad values refused by `numarun submit`
with exit 2, one line naming the value, and nothing submitted."""

import os
import subprocess
import sys

import pytest

from numarun.errors import SlurmError
from numarun.slurm.options import SlurmOptions, check_env, check_output_dir, format_time, parse_time

NUMARUN = [sys.executable, "-m", "numarun"]


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 30 * 60),
        ("90", 90 * 60),
        ("10:30", 10 * 60 + 30),
        ("01:00:00", 3600),
        ("100:00:00", 100 * 3600),
        ("2-00", 2 * 86400),
        ("1-12", 86400 + 12 * 3600),
        ("1-02:03", 86400 + 2 * 3600 + 3 * 60),
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
        ("UNLIMITED", None),
        ("infinite", None),
        ("0", None),
    ],
)
def test_time_formats(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize(
    "text", ["1:2:3:4", "", "abc", "1-", "-5", "1:60", "1:00:60", "1-24", "1-2:60", "5m", "1.5", "1- 2", "١٢"]
)
def test_bad_times(text):
    with pytest.raises(SlurmError) as e:
        parse_time(text)
    assert repr(text) in str(e.value) and "D-HH:MM:SS" in str(e.value)


@pytest.mark.parametrize("text", ["99999999999999999999", "366-00", "525601", "9000:00:00"])
def test_times_beyond_a_year_are_refused(text):
    with pytest.raises(SlurmError) as e:
        parse_time(text)
    assert repr(text) in str(e.value) and "365-00:00:00" in str(e.value)
    assert parse_time("365-00") == 365 * 86400


def test_format_time_round_trips():
    for seconds in (59, 3600, 86400 + 61, 3 * 86400 + 3599):
        assert parse_time(format_time(seconds)) == seconds
    assert format_time(None) == "UNLIMITED"


BAD_OPTIONS = [
    (dict(nodes=0), "--nnodes", "0"),
    (dict(nodes=-1), "--nnodes", "-1"),
    (dict(nproc_per_node=0), "--nproc-per-node", "0"),
    (dict(cpus_per_task=0), "--cpus-per-task", "0"),
    (dict(gpus_per_node="four"), "--gpus-per-node", "'four'"),
    (dict(gpus_per_node="a100:"), "--gpus-per-node", "'a100:'"),
    (dict(partition="gpu;rm"), "--partition", "'gpu;rm'"),
    (dict(partition="a b"), "--partition", "'a b'"),
    (dict(partition="p\nq"), "--partition", "'p\\nq'"),
    (dict(account="$(id)"), "--account", "'$(id)'"),
    (dict(qos="hi gh"), "--qos", "'hi gh'"),
    (dict(job_name=""), "--job-name", "''"),
    (dict(job_name="x`id`"), "--job-name", "'x`id`'"),
    (dict(constraint="a100 && x"), "--constraint", "'a100 && x'"),
    (dict(mem="lots"), "--mem", "'lots'"),
    (dict(requeue_limit=-1), "--requeue-limit", "-1"),
    (dict(signal_before=0), "--signal-before", "0"),
    (dict(signal_before=70000), "--signal-before", "70000"),
    (dict(time="10", signal_before=600), "--signal-before", "600"),
    (dict(time="1:2:3:4"), "--time", "'1:2:3:4'"),
    (dict(extra_sbatch=("--mail-type=END\n#SBATCH --x",)), "extra sbatch option", "END"),
]


@pytest.mark.parametrize("kwargs, flag, shown", BAD_OPTIONS)
def test_bad_options(kwargs, flag, shown):
    with pytest.raises(SlurmError) as e:
        SlurmOptions(**kwargs).validate()
    msg = str(e.value)
    assert flag in msg and shown in msg and "expected" in msg and "\n" not in msg


def test_good_options_pass():
    o = SlurmOptions(
        nodes=4,
        nproc_per_node=8,
        gpus_per_node="h100:8",
        partition="gpu,gpu-long",
        time="1-00:00",
        account="proj_1",
        qos="high",
        constraint="a100&ib|[rack1*2]",
        exclusive=True,
        cpus_per_task=64,
        mem="500G",
        job_name="llm-7b.v2",
        requeue_limit=0,
        signal_before=300,
    ).validate()
    assert o.effective_signal_before == 300


def test_default_signal_fits_short_limits():
    assert SlurmOptions().effective_signal_before == 120
    assert SlurmOptions(time="2").effective_signal_before == 30
    assert SlurmOptions(time="0:02").effective_signal_before == 1


def test_env_and_output_dir_checks():
    assert check_env(["A=1", "B_2=x=y", "C="]) == (("A", "1"), ("B_2", "x=y"), ("C", ""))
    for bad in (["1A=x"], ["A"], ["A-B=1"], ["=x"]):
        with pytest.raises(SlurmError):
            check_env(bad)
    assert check_output_dir("/scratch/runs/") == "/scratch/runs"
    for bad in ("relative/dir", "/a b", "/a%j", "/a'b", "/a\nb"):
        with pytest.raises(SlurmError) as e:
            check_output_dir(bad)
        assert repr(bad) in str(e.value)


@pytest.fixture
def spy_path(tmp_path):
    """A PATH whose sbatch/squeue/scontrol record that they were called."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sbatch", "squeue", "scontrol"):
        p = bindir / tool
        p.write_text(f"#!/bin/sh\necho {tool} >> {tmp_path}/called\necho 1\n")
        p.chmod(0o755)
    return tmp_path


CLI_BAD = [
    (["--time", "1:2:3:4"], "'1:2:3:4'"),
    (["--nodes", "0"], "--nodes '0'"),
    (["--nnodes", "0"], "--nnodes '0'"),
    (["--nodes", "two"], "'two'"),
    (["--partition", "gpu$(id)"], "gpu$(id)"),
    (["--env", "not a var=1"], "--env"),
    (["--output-dir", "/tmp/with space"], "with space"),
    (["--signal-before", "99999"], "99999"),
    (["--gpus-per-node", "x:y"], "'x:y'"),
    (["--numarun", "'unclosed"], "--numarun"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags, shown", CLI_BAD)
def test_cli_refuses_bad_options_and_submits_nothing(flags, shown, spy_path, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = dict(os.environ, PATH=f"{spy_path}/bin:{os.environ['PATH']}")
    proc = subprocess.run(
        NUMARUN
        + [
            "submit",
            *flags,
            "--output-dir" if "--output-dir" not in flags else "--job-name",
            str(tmp_path / "out") if "--output-dir" not in flags else "j",
            str(script),
            "a=1",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and shown in lines[0] and "Traceback" not in proc.stderr
    assert not (spy_path / "called").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_cli_missing_script(spy_path, tmp_path):
    env = dict(os.environ, PATH=f"{spy_path}/bin:{os.environ['PATH']}")
    proc = subprocess.run(
        NUMARUN + ["submit", str(tmp_path / "nope.py")], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2 and "nope.py" in proc.stderr and "expected an existing script file" in proc.stderr
    assert not (spy_path / "called").exists()
