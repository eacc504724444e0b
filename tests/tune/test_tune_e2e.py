"""numarun tune end to end: real numarun runs of real scripts, real bindings (2-rank gloo-free jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from helpers import REPO, SCRIPTS

from numarun import envvars
from numarun.plan.model import LaunchPlan

pytestmark = pytest.mark.slow

FAKE = str(SCRIPTS / "tune_fake.py")
TRAIN = str(REPO / "scripts" / "train.py")


def tune(args: list[str], cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_"))}
    return subprocess.run(
        [sys.executable, "-m", "numarun", "tune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs so that exclusive differs from none")
def test_fake_job_is_tuned_to_its_fastest_binding(tmp_path: Path) -> None:
    r = tune(
        [
            "--binding",
            "none,exclusive",
            "--mem-policy",
            "bind,preferred",
            "--nproc-per-node",
            "2",
            "--trials",
            "2",
            "--json-file",
            "t.json",
            "--save",
            "best.json",
            "--svg",
            "t.svg",
            "--work-dir",
            "runs",
            FAKE,
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["best"]["options"] == {"binding": "exclusive", "mem-policy": "preferred"}
    assert report["unit"] == "samples/s"
    by = {(c["options"]["binding"], c["options"]["mem-policy"]): c for c in report["candidates"]}
    assert by[("exclusive", "bind")]["default"] and by[("exclusive", "bind")]["ratio_to_default"] == 1.0
    assert by[("exclusive", "preferred")]["ratio_to_default"] == 2.0  # twice the samples on the same CPUs
    assert all(len(c["runs_s"]) == 2 and c["throughput"] is not None for c in report["candidates"])
    assert "*best*" in r.stdout and "binding=exclusive mem-policy=preferred" in r.stdout.splitlines()[-1]
    assert ElementTree.parse(tmp_path / "t.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    plan = LaunchPlan.from_json((tmp_path / "best.json").read_text())
    assert plan.binding.value == "exclusive" and plan.mem_policy.value == "preferred" and plan.nproc_per_node == 2
    # the saved plan runs: numarun --plan-file applies it (the fake reports preferred's doubled speed)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_"))}
    env[envvars.REPORT] = str(tmp_path / "again.jsonl")
    run = subprocess.run(
        [sys.executable, "-m", "numarun", "--standalone", "--plan-file", "best.json", FAKE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert sorted(row["samples"] for row in rows) == [2.0, 2.0]


def test_omp_candidates_set_the_workers_threads(tmp_path: Path) -> None:
    script = tmp_path / "omp.py"
    script.write_text("import os, numarun\nnumarun.report(samples=int(os.environ['OMP_NUM_THREADS']), seconds=1)\n")
    r = tune(["--omp", "1,3", "--trials", "1", "--json-file", "t.json", "--save", "p.json", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "t.json").read_text())
    assert [c["throughput"] for c in report["candidates"]] == [1.0, 3.0]
    assert report["best"]["options"] == {"omp": "3"}
    plan = LaunchPlan.from_json((tmp_path / "p.json").read_text())
    assert all(rank.env["OMP_NUM_THREADS"] == "3" for rank in plan.ranks)


def test_wall_time_when_nothing_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("pass\n")
    r = tune(["--binding", "exclusive,none", "--trials", "1", "--json", str(script)], tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # --json: the results on stdout, alone, as topo, plan and doctor print theirs
    assert report["unit"] == "s" and all(c["throughput"] is None and c["median_s"] > 0 for c in report["candidates"])
    assert report["best"]["options"]["binding"] in ("exclusive", "none")


def test_hydra_override_lists_report_throughput_and_peak_memory(tmp_path: Path) -> None:
    r = tune(
        [
            "--nproc-per-node",
            "1",
            "--trials",
            "1",
            "--json-file",
            "t.json",
            TRAIN,
            "trainer.batch_size=4,8",
            "trainer.steps=3",
            "trainer.log_interval=1",
            "trainer.progress=false",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "t.json").read_text())
    assert [c["options"] for c in report["candidates"]] == [{"trainer.batch_size": "4"}, {"trainer.batch_size": "8"}]
    assert report["unit"] in ("samples/s", "tokens/s")
    for c in report["candidates"]:
        assert c["throughput"] > 0 and c["peak_mem_mb"] > 0


def test_a_failing_candidate_stops_the_tune(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(3)\n")
    r = tune(["--binding", "exclusive,none", "--trials", "1", "--json-file", "t.json", str(script)], tmp_path)
    assert r.returncode == 1
    assert "candidate 'binding=exclusive' failed" in r.stderr
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--binding", "exclusive,fast", "x.py"], "'fast'"),
        (["--trials", "0", "--binding", "none", "x.py"], "--trials '0'"),
        (["--omp", "2,zero", "x.py"], "'zero'"),
        (["--binding", "none", "missing.py"], "missing.py"),
        (["x.py"], "nothing to compare"),
        (["--binding", "none", "--json-file", "no/such/dir/t.json", "x.py"], "--json-file 'no/such/dir/t.json'"),
        (["--binding", "none", "--save", ".", "x.py"], "--save '.'"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "x.py").write_text("pass\n")
    r = tune(args, tmp_path, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]  # nothing half-written
