"""``hydra/launcher=numarun``: a Hydra app's sweep, any sweeper, each job a numarun job in a slot of its own.

Every case runs a real Hydra app (written here) in its own directory, as a user runs it:
``python app.py -m hydra/launcher=numarun ...`` or ``numarun app.py -m ...``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from golden import GOLDEN_DIR, check_golden
from helpers import FIXTURES, RECORDING_SAMPLER, REPO, TIMEOUT, clean_env, error_lines, numarun_cmd, wait_until

pytestmark = pytest.mark.slow

APP = """
import json, os, time
from pathlib import Path

import hydra


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def job(cfg):
    out, me = Path(cfg.out), str(cfg.x)
    start = time.time()
    if cfg.get("usr1"):  # SIGUSR1 ends the wait (a trainer would checkpoint)
        import signal
        signal.signal(signal.SIGUSR1, lambda *_: (out / f"usr1.{me}").write_text("1"))
    (out / f"started.{me}").write_text(json.dumps({"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}))
    if cfg.get("meet"):  # wait until the other job of the pair has started too
        deadline = time.monotonic() + 120
        while len(list(out.glob("started.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    while cfg.get("block") and not (out / "release").exists() and not (out / f"usr1.{me}").exists():
        time.sleep(0.05)
    ran = {"start": start, "end": time.time(), "cpus": sorted(os.sched_getaffinity(0))}
    (out / f"ran.{me}").write_text(json.dumps(ran))
    if cfg.get("fail") == cfg.x:
        raise ValueError("boom")
    if cfg.get("unpicklable") == cfg.x:
        return lambda: cfg.x
    return (cfg.x - 2) ** 2


if __name__ == "__main__":
    job()
"""


CALLBACK = """
import os
from pathlib import Path

from hydra.experimental.callback import Callback


class Recorder(Callback):
    def on_job_start(self, config, **kwargs):
        Path(config.out, f"job_start.{config.x}").write_text(str(os.getpid()))

    def on_job_end(self, config, job_return, **kwargs):
        Path(config.out, f"job_end.{config.x}").write_text(job_return.status.name)
"""


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "recording_cb.py").write_text(CALLBACK)
    (tmp_path / "out").mkdir()
    return tmp_path


def sweep(where: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python app.py -m hydra/launcher=numarun ARGS`` to its end."""
    return subprocess.run(
        [sys.executable, "app.py", "-m", "hydra/launcher=numarun", f"+out={where / 'out'}", *args],
        cwd=where,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def record(where: Path, kind: str) -> dict[str, dict[str, object]]:
    """What each job wrote when it started or ended, by its ``x``."""
    return {p.name.split(".", 1)[1]: json.loads(p.read_text()) for p in (where / "out").glob(f"{kind}.*")}


def test_two_one_rank_jobs_run_at_once_each_on_its_own_core(app: Path) -> None:
    proc = sweep(app, "+x=1,2", "+meet=1", "+hydra.callbacks.rec._target_=recording_cb.Recorder")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Hydra's job callbacks, called in each job's own process
    assert {x: int(p.read_text()) for x, p in ((p.name[10:], p) for p in (app / "out").glob("job_start.*"))} == {
        x: r["pid"] for x, r in record(app, "started").items()
    }
    assert sorted(p.read_text() for p in (app / "out").glob("job_end.*")) == ["COMPLETED", "COMPLETED"]
    ran = record(app, "ran")
    a, b = ran["1"], ran["2"]
    assert max(a["start"], b["start"]) < min(a["end"], b["end"])  # their run intervals overlap
    assert len(a["cpus"]) == 1 and len(b["cpus"]) == 1 and a["cpus"] != b["cpus"]  # type: ignore[arg-type]
    # Hydra's multirun layout, as the basic launcher makes it
    (sweep_dir,) = list((app / "multirun").glob("*/*"))
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["0", "1", "multirun.yaml"]
    assert sorted(p.name for p in (sweep_dir / "0").iterdir()) == [".hydra", "app.log"]


def test_an_optuna_sweep_of_two_jobs_at_a_time_reaches_optuna(app: Path) -> None:
    (app / "recording.py").write_text(RECORDING_SAMPLER)
    trials = app / "trials.jsonl"
    proc = sweep(
        app,
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.n_jobs=2",
        "+x=interval(0,4)",
        "hydra.sweeper.sampler._target_=recording.RecordingSampler",
        TRIALS=str(trials),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    told = [json.loads(line) for line in trials.read_text().splitlines()]
    assert len(told) == 6 and all(t["state"] == "COMPLETE" for t in told)
    for t in told:  # each trial's own value, computed in its job, handed back through the JobReturn
        assert t["values"] == [pytest.approx((t["params"]["+x"] - 2) ** 2)]
    assert len(record(app, "ran")) == 6


def test_a_failed_job_and_a_value_that_cannot_be_handed_back_fail_alone(app: Path) -> None:
    proc = sweep(app, "+x=1,2,3", "+fail=1", "+unpicklable=2")
    assert proc.returncode == 1  # Hydra's sweeper reports the first failed job once every job ran
    assert sorted(record(app, "ran")) == ["1", "2", "3"]
    (line,) = error_lines(proc.stderr)
    assert re.fullmatch(
        r"numarun: error: bad return value of job #1: function cannot be handed back to the sweeper "
        r"\(.*\); expected a value pickle can write \(a number, a dict\.\.\.\)",
        line,
    ), line
    assert "ValueError: boom" in proc.stderr


def test_a_job_larger_than_the_node_is_refused_before_anything_starts(app: Path) -> None:
    proc = sweep(app, "+x=1,2", "hydra.launcher.nproc_per_node=64")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = error_lines(proc.stderr)
    assert line.startswith("numarun: error: bad nproc_per_node 64 for a job of a sweep: this node has ")
    assert "Traceback" not in proc.stderr and record(app, "started") == {}


def test_a_signal_to_the_sweep_ends_every_job(app: Path) -> None:
    cmd = [
        sys.executable,
        "app.py",
        "-m",
        "hydra/launcher=numarun",
        "hydra.launcher.max_jobs=2",
        f"+out={app / 'out'}",
        "+x=1,2,3,4",
        "+block=1",
    ]
    sweeper = subprocess.Popen(cmd, cwd=app, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = wait_until(
        "two jobs started", lambda: record(app, "started") if len(record(app, "started")) == 2 else None, proc=sweeper
    )
    sweeper.send_signal(signal.SIGINT)
    _, err = sweeper.communicate(timeout=TIMEOUT)
    assert sweeper.returncode == 128 + signal.SIGINT, err[-2000:]
    assert error_lines(err) == ["numarun: error: stopped by SIGINT: 2 running jobs ended, 2 not started"]
    assert not any(psutil.pid_exists(int(s["pid"])) for s in started.values())  # type: ignore[call-overload]
    assert record(app, "ran") == {} and len(record(app, "started")) == 2


def test_sigusr1_to_the_sweep_reaches_every_running_job(app: Path) -> None:
    cmd = [
        sys.executable,
        "app.py",
        "-m",
        "hydra/launcher=numarun",
        "hydra.launcher.max_jobs=2",
        f"+out={app / 'out'}",
        "+x=1,2",
        "+block=1",
        "+usr1=1",
    ]
    sweeper = subprocess.Popen(cmd, cwd=app, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until("two jobs started", lambda: len(record(app, "started")) == 2 or None, proc=sweeper)
    sweeper.send_signal(signal.SIGUSR1)
    _, err = sweeper.communicate(timeout=TIMEOUT)
    assert sweeper.returncode == 0, err[-2000:]
    assert sorted(record(app, "usr1")) == sorted(record(app, "ran")) == ["1", "2"]


def test_numarun_app_m_runs_each_job_of_two_ranks_in_a_slot(app: Path) -> None:
    """``numarun --nproc-per-node 2 app.py -m``: each job a numarun job of two ranks (one slot of both cores)."""
    proc = subprocess.run(
        [*numarun_cmd(), "--nproc-per-node", "2", "app.py", "-m", f"+out={app / 'out'}", "+x=1,2"],
        cwd=app,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(record(app, "ran")) == ["1", "2"]
    hydra_yaml = next(app.rglob("0/.hydra/hydra.yaml")).read_text()
    assert "hydra/launcher: numarun" in hydra_yaml  # numarun chose the launcher
    assert len(re.findall(r"numarun: INFO: rank [01]: ", proc.stderr)) == 4  # 2 jobs x 2 bound ranks


def test_dry_run_shows_the_slots_and_starts_nothing(app: Path) -> None:
    proc = subprocess.run(
        [*numarun_cmd(), "--dry-run", "app.py", "-m", "+x=1,2,3"],
        cwd=app,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("3 jobs of 1 rank, ") and "<- #0 +x=1" in lines[1]
    assert sorted(p.name for p in app.iterdir()) == ["app.py", "out", "recording_cb.py"]
    nvswitch = FIXTURES / "nvidia-smi" / "h100-8gpu-13nic-mlx5_ib-penny.txt"
    proc = subprocess.run(
        [*numarun_cmd(), "plan", "--topology", str(nvswitch), "--nproc-per-node", "2", "--jobs", "6"],
        cwd=app,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    check_golden(GOLDEN_DIR / "sweep" / "plan-jobs-penny-2x6.txt", proc.stdout.replace(str(REPO), "<repo>"))


def test_numarun_trainer_sweep_goes_through_the_launcher(tmp_path: Path) -> None:
    train = str(REPO / "scripts" / "train.py")
    proc = subprocess.run(
        [*numarun_cmd(), train, "-m", "trainer.steps=1,2"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep_dir,) = list((tmp_path / "multirun").glob("*/*"))
    for num, steps in ((0, 1), (1, 2)):
        assert json.loads((sweep_dir / str(num) / "summary.json").read_text())["steps_done"] == steps
        assert (sweep_dir / str(num) / "config.yaml").is_file() and (
            sweep_dir / str(num) / ".hydra" / "hydra.yaml"
        ).is_file()


@pytest.mark.parametrize("pack", [None, 2])
def test_slurm_launcher_renders_a_job_array(app: Path, pack: int | None) -> None:
    options = "[--gpus-per-node,2,--exclusive,--partition,gpu,--time,'1:00:00']"  # whole nodes of 2 GPUs
    proc = sweep(
        app,
        "hydra/launcher=numarun_slurm",
        "hydra.launcher.dry_run=true",
        f"hydra.launcher.submit_options={options}",
        "hydra.sweep.dir=sweep",
        "+x=1,2,3",
        *([f"hydra.launcher.pack={pack}"] if pack else []),
        NUMARUN_HYDRA_NOW="2020-01-02T03:04:05",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout[proc.stdout.index("#!/bin/bash") :]
    text = text.replace(str(app), "<cwd>").replace(str(Path(sys.executable).parent), "<bin>")
    check_golden(GOLDEN_DIR / "sweep" / f"slurm-array{'-pack' if pack else ''}.sh", text)
    assert record(app, "started") == {}  # nothing ran


# ----------------------------------------------------------------------------- one options path, one composition

PLAN_APP = """
import json, os
from pathlib import Path

import hydra

from numarun.worker import load_plan


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def job(cfg):
    plan = load_plan(os.environ)
    Path(cfg.out, f"plan.{cfg.x}.{os.environ['RANK']}").write_text(json.dumps({
        "binding": plan.binding.value, "mem_policy": plan.mem_policy.value, "nic_policy": plan.nic_policy.value,
        "world": int(os.environ["WORLD_SIZE"]), "cpus": sorted(os.sched_getaffinity(0))}))


if __name__ == "__main__":
    job()
"""

COUNTING_CALLBACK = """
import os
from pathlib import Path

from hydra.experimental.callback import Callback


class Counter(Callback):
    def on_job_start(self, config, **kwargs):
        with open(Path(config.out, f"job_start.{config.x}"), "a") as f:
            f.write(f"{os.getpid()}\\n")
"""


def _shown(err: str, job: int, dest: str) -> str:
    """The value and source ``--show-sources`` printed for ``dest`` of job ``job``, spaces squeezed."""
    block = err[err.index(f"# job #{job} ") :]
    return " ".join(next(line for line in block.splitlines() if line.startswith(f"#   {dest} ")).split()[2:])


@pytest.mark.parametrize(
    ("variable", "text", "dest", "shown", "planned"),
    [
        ("NUMARUN_BINDING", "none", "binding", "none", {"binding": "none"}),
        ("NUMARUN_MEM_POLICY", "preferred", "mem_policy", "preferred", {"mem_policy": "preferred"}),
        ("NUMARUN_NIC_POLICY", "per-rank", "nic_policy", "per-rank", {"nic_policy": "per-rank"}),
        ("NUMARUN_STRICT_BINDING", "1", "strict_binding", "True", {}),
        ("PET_NPROC_PER_NODE", "2", "nproc_per_node", "2", {"world": 2}),
    ],
)
def test_each_variable_reaches_every_job_of_a_sweep_as_it_reaches_a_run(
    tmp_path: Path, variable: str, text: str, dest: str, shown: str, planned: dict
) -> None:
    """``NUMARUN_BINDING=none python app.py -m hydra/launcher=numarun``: every job unbound, as in a run (its
    process on every CPU the sweep has, not its slot's); each variable named as the source in each job's
    ``--show-sources`` block."""
    (tmp_path / "app.py").write_text(PLAN_APP)
    (tmp_path / "out").mkdir()
    proc = sweep(tmp_path, "+x=1,2", "hydra.launcher.options=[--show-sources]", **{variable: text})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in (0, 1):
        assert _shown(proc.stderr, job, dest) == f"{shown} environment ({variable})", proc.stderr[-3000:]
    plans = {p.name: json.loads(p.read_text()) for p in (tmp_path / "out").glob("plan.*")}
    assert len(plans) == 2 * planned.get("world", 1), plans
    assert all(p.items() >= planned.items() for p in plans.values()), plans
    every = sorted(os.sched_getaffinity(0))  # the sweep's own CPUs: it inherits this process's
    if variable == "NUMARUN_BINDING":  # unbound: the kernel's answer in each rank is the whole of the sweep's
        assert all(p["cpus"] == every for p in plans.values()), plans
    elif len(every) > 1:  # bound: each rank on a part of them
        assert all(set(p["cpus"]) < set(every) for p in plans.values()), plans


def test_numarun_topology_reaches_the_sweeps_slots(app: Path) -> None:
    nvswitch = FIXTURES / "nvidia-smi" / "h100-8gpu-13nic-mlx5_ib-penny.txt"
    proc = subprocess.run(
        [*numarun_cmd(), "--dry-run", "--nproc-per-node", "2", "app.py", "-m", "+x=1,2"],
        cwd=app,
        env=clean_env(NUMARUN_TOPOLOGY=str(nvswitch)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("2 jobs of 2 ranks, 4 at a time on nvidia-smi:") and "GPU 0-1" in proc.stdout, (
        proc.stdout
    )


def test_a_trainer_sweep_composes_each_job_once_and_its_config_does_not_beat_the_environment(tmp_path: Path) -> None:
    """``numarun --show-sources train.py -m ... launcher.binding=node`` with NUMARUN_BINDING=none: the environment
    wins over the job config in every job, as in a run; Hydra composes each job once (numarun checks every job
    before the first starts, and the launcher runs those same configs)."""
    count = tmp_path / "compositions"
    wrapper = (
        "import sys\n"
        "from hydra._internal.config_loader_impl import ConfigLoaderImpl as L\n"
        "real = L.load_sweep_config\n"
        "def counted(self, *a, **k):\n"
        f"    open({str(count)!r}, 'a').write('1\\n')\n"
        "    return real(self, *a, **k)\n"
        "L.load_sweep_config = counted\n"
        "from numarun.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            "--show-sources",
            str(REPO / "scripts" / "train.py"),
            "-m",
            "trainer.steps=1",
            "trainer.seed=1,2",
            "launcher.binding=node",
        ],
        cwd=tmp_path,
        env=clean_env(NUMARUN_BINDING="none"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in (0, 1):
        assert _shown(proc.stderr, job, "binding") == "none environment (NUMARUN_BINDING)", proc.stderr[-3000:]
    assert count.read_text().count("1") == 2  # one composition per job
    (sweep_dir,) = list((tmp_path / "multirun").glob("*/*"))
    assert all(json.loads((sweep_dir / n / "summary.json").read_text())["steps_done"] == 1 for n in ("0", "1"))


def test_hydras_job_callbacks_run_once_per_job_not_once_per_rank(app: Path) -> None:
    (app / "counting_cb.py").write_text(COUNTING_CALLBACK)
    proc = sweep(
        app,
        "+x=1,2",
        "hydra.launcher.nproc_per_node=2",
        "hydra.launcher.max_jobs=1",
        "+hydra.callbacks.count._target_=counting_cb.Counter",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(record(app, "ran")) == ["1", "2"]
    for x in ("1", "2"):  # each job of two ranks: one on_job_start
        assert len((app / "out" / f"job_start.{x}").read_text().split()) == 1
