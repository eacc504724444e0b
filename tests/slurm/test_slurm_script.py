"""The rendered sbatch script: golden files, quoting (property test that really runs the
script with a fake srun/scontrol/numarun and compares argv byte for byte), job arrays,
and `numarun submit` against a recording sbatch.

Regenerate the golden scripts with ``NUMARUN_REGEN_GOLDEN=1 pytest tests/slurm/test_slurm_script.py``.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, GOLDEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numarun.slurm.options import SlurmOptions
from numarun.slurm.script import SlurmJob, render_sbatch
from numarun.slurm.submit import overall_return_code, parse_scontrol_jobs

GOLDEN = GOLDEN / "slurm"
FIXTURES = FIXTURES / "slurm"
from golden import check_golden  # noqa: E402

NUMARUN = ("/opt/numarun/.venv/bin/numarun",)

GOLDEN_JOBS = {
    "two-nodes": SlurmJob(
        script="/home/ada/proj/scripts/train.py",
        output_dir="/scratch/ada/runs",
        options=SlurmOptions(nodes=2, nproc_per_node=2, time="30"),
        arg_sets=(("model=gpt", "trainer.steps=100", "x=$(touch /tmp/pwned)", "name=it's `id`"),),
        numarun=NUMARUN,
        hydra_run_dir=True,
        env=(("GLOO_SOCKET_IFNAME", "eth1"), ("NOTE", "a b; $c")),
    ),
    "all-options": SlurmJob(
        script="/home/ada/my project/run.py",
        output_dir="/scratch/ada/runs",
        options=SlurmOptions(
            nodes=4,
            nproc_per_node=8,
            gpus_per_node="h100:8",
            partition="gpu",
            time="1-12:00",
            account="proj1",
            qos="high",
            constraint="ib&nvlink",
            exclusive=True,
            cpus_per_task=96,
            mem="900G",
            job_name="llm",
            requeue_limit=5,
            signal_before=300,
            extra_sbatch=("--mail-type=END",),
        ),
        arg_sets=(("--epochs", "3", "--data", "/data/set one"),),
        numarun=NUMARUN,
        launch_opts=("--binding", "socket"),
    ),
    "sweep-array": SlurmJob(
        script="/home/ada/proj/scripts/train.py",
        output_dir="/scratch/ada/runs",
        options=SlurmOptions(nodes=1, time="10:00"),
        arg_sets=(
            ("optim=sgd", "lr=0.1"),
            ("optim=sgd", "lr=0.01"),
            ("optim=adamw", "lr=0.1"),
            ("optim=adamw", "lr=0.01"),
        ),
        numarun=NUMARUN,
        hydra_run_dir=True,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GOLDEN_JOBS))
def test_golden_scripts(name):
    text = render_sbatch(GOLDEN_JOBS[name])
    path = GOLDEN / f"{name}.sh"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    check_golden(path, text)


def test_header_and_runtime_pieces():
    text = render_sbatch(GOLDEN_JOBS["two-nodes"])
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" in header and "#SBATCH --ntasks-per-node=1" in header
    assert "#SBATCH --signal=B:USR1@120" in header and "#SBATCH --requeue" in header
    assert "#SBATCH --output=/scratch/ada/runs/slurm-%j.out" in header
    # no resource options: whole nodes
    assert "#SBATCH --exclusive" in header
    assert "# Requested: 2 whole nodes (--exclusive): every CPU, no GPUs" in text
    # the per-node logic runs on each node, in Python
    assert '"${numarun[@]}" slurm-node task --run-dir "$run_dir" --job-key "$job_key"' in text
    # srun of 22.05-23.02 does not inherit --cpus-per-task: restated
    assert '--cpus-per-task="$cpus"' in text


def test_whole_nodes_by_default_and_parts_on_request():
    def header(**kw):
        return [
            line
            for line in render_sbatch(
                SlurmJob(script="/p/t.py", output_dir="/o", options=SlurmOptions(**kw))
            ).splitlines()
            if line.startswith("#SBATCH") or line.startswith("# Requested")
        ]

    default = header(nodes=2, node_gpus=4)
    assert "#SBATCH --exclusive" in default and "#SBATCH --gpus-per-node=4" in default
    assert "# Requested: 2 whole nodes (--exclusive): every CPU, 4 GPUs" in default
    part = header(nodes=2, cpus_per_task=8, node_gpus=4)
    assert "#SBATCH --exclusive" not in part and "#SBATCH --cpus-per-task=8" in part
    assert not any("gpus-per-node" in line for line in part)
    assert "# Requested: 2 nodes, part of each: 8 CPUs, no GPUs" in part
    gpus = header(nodes=1, gpus_per_node="2", node_gpus=4)
    assert "#SBATCH --exclusive" not in gpus and "#SBATCH --gpus-per-node=2" in gpus
    shared = header(nodes=1, exclusive=False, node_gpus=4)
    assert "#SBATCH --exclusive" not in shared and not any("gpus-per-node" in line for line in shared)
    both = header(nodes=1, exclusive=True, cpus_per_task=4)
    assert "#SBATCH --exclusive" in both and "#SBATCH --cpus-per-task=4" in both


def test_grace_follows_signal_before():
    def opts(**kw):
        text = render_sbatch(SlurmJob(script="/p/t.py", output_dir="/o", options=SlurmOptions(**kw)))
        return next(line for line in text.splitlines() if line.startswith("launch_opts="))

    assert opts(signal_before=120) == "launch_opts=(--shutdown-timeout 105)"
    assert opts(signal_before=20) == "launch_opts=(--shutdown-timeout 15)"
    # the user's own --shutdown-timeout wins
    text = render_sbatch(SlurmJob(script="/p/t.py", output_dir="/o", launch_opts=("--shutdown-timeout=7",)))
    assert "launch_opts=(--shutdown-timeout=7)" in text


# ----------------------------------------------------------------------------- executing it


def _fake_bin(tmp: Path) -> Path:
    """srun runs its command once as node 0; numarun writes the argv of its per-node task
    NUL-separated (byte exact) and one env value, and the arguments of 'finish'."""
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    (b / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexport SLURM_NODEID=0\n"$@"\n')
    (b / "scontrol").write_text(
        "#!/bin/bash\n"
        'case "$1 $2" in\n'
        '  "show hostnames") echo n1 ;;\n'
        '  "show node") echo "NodeName=n1 Arch=x86_64"; echo "   NodeAddr=127.0.0.1 NodeHostName=h" ;;\n'
        f'  requeue*) echo "$*" >> {tmp}/requeued ;;\n'
        "esac\n"
    )
    (b / "numarun").write_text(
        '#!/bin/bash\nif [ "$2" = task ]; then printf "%s\\0" "$@" > "$ARGV_OUT"; printf "%s" "${PROBE-unset}" > '
        '"$ENV_OUT";'
        ' else echo "$*" > "$ARGV_OUT.finish"; fi\n'
    )
    for f in b.iterdir():
        f.chmod(0o755)
    return b


def _run_script(tmp: Path, job: SlurmJob, *, array_index: int | None = None) -> tuple[list[str], str]:
    b = _fake_bin(tmp)
    script = tmp / "job.sh"
    script.write_text(render_sbatch(job))
    env = {
        "PATH": f"{b}:/usr/bin:/bin",
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURMD_NODENAME": "n1",
        "ARGV_OUT": str(tmp / "argv"),
        "ENV_OUT": str(tmp / "env"),
    }
    if array_index is not None:
        env.update(SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID=str(array_index))
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    argv = (tmp / "argv").read_bytes().decode("utf-8").split("\0")[:-1]
    return argv, (tmp / "env").read_bytes().decode("utf-8")


def _job(tmp: Path, script: str, args: tuple[str, ...], probe: str) -> SlurmJob:
    return SlurmJob(
        script=script,
        output_dir=str(tmp / "out"),
        options=SlurmOptions(nodes=1, nproc_per_node=2),
        arg_sets=(args,),
        env=(("PROBE", probe),),
        numarun=(str(tmp / "bin" / "numarun"),),
    )


@pytest.mark.slow
def test_script_runs_the_node_task_then_finish(tmp_path):
    argv, probe = _run_script(tmp_path, _job(tmp_path, "/p/train.py", ("a=1",), "v"))
    run_dir = f"{tmp_path}/out/4242"
    assert argv == [
        "slurm-node",
        "task",
        "--run-dir",
        run_dir,
        "--job-key",
        "4242",
        "run",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "105",
        "/p/train.py",
        "a=1",
    ]
    assert probe == "v"
    assert (tmp_path / "out" / "4242").is_dir()
    finish = (tmp_path / "argv.finish").read_text().split()
    assert finish == [
        "slurm-node",
        "finish",
        "--run-dir",
        run_dir,
        "--rc",
        "0",
        "--preempted",
        "0",
        "--restart-count",
        "0",
        "--requeue-limit",
        "3",
    ]


@pytest.mark.slow
def test_array_index_selects_its_override_set(tmp_path):
    job = SlurmJob(
        script="/p/train.py",
        output_dir=str(tmp_path / "out"),
        numarun=(str(tmp_path / "bin" / "numarun"),),
        arg_sets=(("lr=1",), ("lr=2", "x=$(y)"), ("lr=3",)),
        hydra_run_dir=True,
    )
    argv, _ = _run_script(tmp_path, job, array_index=1)
    assert argv[-3:] == ["lr=2", "x=$(y)", f"hydra.run.dir={tmp_path}/out/4240_1"]
    assert argv[argv.index("--job-key") + 1] == "4240_1"


CANARY = "/tmp/numarun-quoting-canary"
FRAGMENTS = [
    f"$(touch {CANARY})",
    f"`touch {CANARY}`",
    f"; touch {CANARY}",
    f"\ntouch {CANARY}\n",
    "'",
    '"',
    "\\",
    "$HOME",
    "${IFS}",
    "$1",
    "*",
    "?",
    "!",
    "#",
    "&&",
    "|",
    ">x",
    "<y",
    "~",
    "%j",
    "@@SCRIPT@@",
    "\t",
    " ",
    "-",
    "=",
    "é",
    "日本",
]
piece = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
    st.sampled_from(FRAGMENTS),
)
user_string = st.lists(piece, max_size=6).map("".join)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(user_string, max_size=4), script_name=user_string, probe=user_string)
def test_any_user_value_arrives_byte_exact(tmp_path, args, script_name, probe):
    if os.path.exists(CANARY):
        os.unlink(CANARY)
    script = "/p/" + script_name.replace("/", "_")
    job = _job(tmp_path, script, tuple(args), probe)
    subprocess.run(["bash", "-n"], input=render_sbatch(job), text=True, check=True)
    argv, got_probe = _run_script(tmp_path, job)
    assert argv[-(len(args) + 1) :] == [script, *args]
    assert got_probe == probe
    assert not os.path.exists(CANARY), "a user value was executed by the batch script"


# ----------------------------------------------------------------------------- Slurm's answers


def test_parse_scontrol_records():
    done = parse_scontrol_jobs((FIXTURES / "scontrol-job-completed-requeued.txt").read_text())
    assert [(r.state, r.exit_code, r.restarts, r.return_code) for r in done] == [("COMPLETED", 0, 1, 0)]
    array = parse_scontrol_jobs((FIXTURES / "scontrol-array-one-failed.txt").read_text())
    assert sorted((r.job_id, r.state, r.exit_code) for r in array) == [("8_0", "COMPLETED", 0), ("8_1", "FAILED", 3)]
    assert overall_return_code(array) == 3


@pytest.mark.slow
def test_submit_prints_id_run_dir_and_logs(tmp_path):
    """Against a recording sbatch: the script goes to sbatch on stdin, a copy is kept."""
    b = tmp_path / "bin"
    b.mkdir()
    (b / "sbatch").write_text(
        f'#!/bin/bash\necho "$*" > {tmp_path}/sbatch-args\ncat > {tmp_path}/stdin\necho "321;cluster"\n'
    )
    (b / "sbatch").chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "submit",
            "--nnodes",
            "2",
            "--output-dir",
            str(out),
            str(script),
            "-m",
            "a=1,2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, PATH=f"{b}:{os.environ['PATH']}"),
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sbatch-args").read_text().split() == ["--parsable"]
    sent = (tmp_path / "stdin").read_text()
    assert "#SBATCH --array=0-1" in sent and (out / "sbatch-321.sh").read_text() == sent
    assert proc.stdout.splitlines() == [
        "job id:  321",
        f"run dir: {out}/321_0",
        f"log:     {out}/slurm-321_0.out",
        f"run dir: {out}/321_1",
        f"log:     {out}/slurm-321_1.out",
    ]


@pytest.mark.slow
def test_dry_run_prints_script_only(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "submit",
            "--dry-run",
            "--output-dir",
            str(tmp_path / "o"),
            str(script),
            "x=$(touch /tmp/pwned)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PATH="/usr/bin:/bin"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and shlex.quote("x=$(touch /tmp/pwned)") in proc.stdout
    assert not (tmp_path / "o").exists()


def test_a_module_job_runs_numarun_run_dash_m(tmp_path):
    job = SlurmJob(
        script="numarun.train", module=True, output_dir=str(tmp_path / "out"), arg_sets=(("trainer.steps=3",),)
    )
    text = render_sbatch(job)
    assert "script=numarun.train\n" in text
    opts = next(line for line in text.splitlines() if line.startswith("launch_opts=("))
    assert shlex.split(opts[len("launch_opts=(") : -1])[-1] == "--module"  # right before "$script"
    assert render_sbatch(SlurmJob(script="/p/t.py", output_dir=str(tmp_path / "out"))).count("--module") == 0


@pytest.mark.slow
def test_submit_refuses_a_module_that_does_not_import(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "submit",
            "--dry-run",
            "--output-dir",
            str(tmp_path / "o"),
            "-m",
            "no_such_module_here",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "'no_such_module_here'" in proc.stderr
    assert list(tmp_path.iterdir()) == []
