"""``numarun run`` options -> the launch spec -> torchrun argv, as data (golden file + round trip
through torchrun's parser), and the supervisor's plan file and environment.

Regenerate the golden file with ``NUMARUN_REGEN_GOLDEN=1 pytest tests/launch/test_launch_spec.py``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from golden import check_golden
from helpers import REPO

from numarun.argtypes import NodeRange
from numarun.cli import build_parser
from numarun.commands.run import target_of
from numarun.errors import UsageError
from numarun.launch.spec import LaunchSpec, launch_spec
from numarun.launch.torchrun import ENTRY_FILE, Target, worker_env
from numarun.options.launch import NOT_LAUNCH, LaunchOptions, from_args, given
from numarun.plan.model import BindingMode, LaunchPlan, MemPolicy, RankBinding

GOLDEN = REPO / "tests" / "golden" / "run_torchrun_argv.txt"
SCRIPT = "tests/support/scripts/exit_rank.py"

CASES: list[list[str]] = [
    [SCRIPT, "1", "3"],
    ["--nproc-per-node", "2", "--standalone", SCRIPT, "--lr=3", "x=1", "--nproc-per-node", "9"],
    [
        "--nproc_per_node=4",
        "--nnodes=2",
        "--node_rank",
        "1",
        "--master_addr",
        "10.0.0.1",
        "--master_port=29501",
        SCRIPT,
    ],
    [
        "--nnodes",
        "1:4",
        "--rdzv-backend",
        "c10d",
        "--rdzv_endpoint",
        "localhost:29400",
        "--rdzv-id",
        "job7",
        "--rdzv-conf",
        "timeout=900,read_timeout=60",
        "--max_restarts",
        "3",
        "--monitor-interval",
        "0.5",
        SCRIPT,
    ],
    [
        "--start_method",
        "fork",
        "--role",
        "trainer",
        "--log_dir",
        "/tmp/logs",
        "-r",
        "3",
        "-t",
        "2",
        "--local_ranks_filter",
        "0",
        "--local-addr",
        "127.0.0.1",
        "--signals-to-handle",
        "SIGTERM,SIGUSR1",
        "--shutdown-timeout",
        "5",
        "--duplicate-stdout-filters",
        "loss,step",
        SCRIPT,
    ],
    [
        "--binding",
        "node",
        "--mem-policy",
        "preferred",
        "--strict-binding",
        "--dry-run",
        "-m",
        "json.tool",
        "--config",
        "a.yaml",
    ],
    ["--numa-binding", "socket", "--no-python", "true", "--flag"],
]


def parse(args: list[str]):
    return build_parser(only="run").parse_args(["run", *args])


def options(args: list[str], environ: dict[str, str] | None = None) -> LaunchOptions:
    return from_args(parse(args), environ or {})


def spec_for(args: list[str], nproc: int = 2) -> LaunchSpec:
    opts = options(args)
    return launch_spec(opts, nproc_per_node=opts.nproc_per_node or nproc, target=target_of(parse(args)))


def argv_for(args: list[str], nproc: int = 2) -> tuple[list[str], Target]:
    spec = spec_for(args, nproc)
    return spec.argv(), spec.target


def test_golden_argv() -> None:
    text = "".join(
        f"$ numarun {shlex.join(args)}\n{shlex.join(['torchrun', *argv_for(args)[0]])}\n\n" for args in CASES
    )
    check_golden(GOLDEN, text.replace(ENTRY_FILE, "<numarun>/worker/entry.py"))


@pytest.mark.parametrize("args", CASES, ids=range(len(CASES)))
def test_torchrun_reads_back_the_same_options(args: list[str]) -> None:
    from torch.distributed.run import get_args_parser  # torch's own parser, as torchrun parses the argv

    opts = options(args)
    argv, target = argv_for(args, nproc=3)
    back = get_args_parser().parse_args(argv)
    assert back.nproc_per_node == str(opts.nproc_per_node or 3)
    assert not back.module and back.training_script == ENTRY_FILE and back.numa_binding is None
    assert back.training_script_args == target.bootstrap_args()
    skipped = {"nproc_per_node", "numa_binding", "local_addr", *NOT_LAUNCH}
    for action in get_args_parser()._actions:
        if action.dest not in skipped:
            want = opts.setting(action.dest).value  # the text, for an option torch's own type parses (a comma list)
            want = str(want) if isinstance(want, NodeRange) else want  # --nnodes: torchrun reads its text
            want = action.type(want) if isinstance(want, str) and callable(action.type) else want
            assert getattr(back, action.dest) == want, action.dest
    # the address rule: loopback for one node (and for nodes meeting at a loopback endpoint); not needed by static
    assert back.local_addr == (opts.setting("local_addr").value or (None if args == CASES[2] else "127.0.0.1"))


def test_the_spec_holds_what_numarun_reads_of_the_launch() -> None:
    spec = spec_for(CASES[3])  # c10d, 1:4 nodes, rdzv conf
    assert spec.nnodes == NodeRange(1, 4) and spec.multi_node and spec.max_restarts == 3
    assert spec.rendezvous_deadline() == (615, "join_timeout=600 + 15 s")
    assert spec.store_address() == ("localhost", 29400) and spec.node_label().endswith(f".{os.getpid()}")
    spec = spec_for(CASES[2])  # static, node 1 of 2
    assert spec.store_address() == ("10.0.0.1", 29501) and spec.node_label() == "node1"
    assert spec.rendezvous_deadline() == (915, "timeout=900 + 15 s")
    spec = spec_for(CASES[4])
    assert spec.death_signals == ("SIGTERM", "SIGUSR1") and spec.shutdown_timeout == 5 and spec.log_dir == "/tmp/logs"
    assert ("--role", "trainer") in spec.passthrough and spec.store_address() is None and spec.node_label() is None
    # the private log dir only where the user gave none
    assert "--log-dir=/tmp/logs" in spec.argv(log_dir="/private") and "--log-dir=/private" in spec_for(CASES[0]).argv(
        log_dir="/private"
    )
    standalone = spec_for(CASES[1])
    assert standalone.backend == "c10d" and not standalone.multi_node


def test_numarun_options_are_parsed_and_script_args_untouched() -> None:
    ns, opts = parse(CASES[5]), options(CASES[5])
    assert opts.binding is BindingMode.NODE and opts.mem_policy is MemPolicy.PREFERRED
    assert opts.strict_binding and ns.dry_run and ns.module
    assert (ns.training_script, ns.training_script_args) == ("json.tool", ["--config", "a.yaml"])
    ns = parse(CASES[1])
    assert options(CASES[1]).nproc_per_node == 2 and ns.training_script_args == [
        "--lr=3",
        "x=1",
        "--nproc-per-node",
        "9",
    ]
    assert options(CASES[6]).binding is BindingMode.SOCKET  # torchrun's spelling of --binding
    assert options([SCRIPT]).nproc_per_node is None  # one rank per GPU, decided by the plan


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no/such.py"], "'no/such.py'"),
        (["--no-python", "no-such-program-here"], "'no-such-program-here'"),
        (["--run-path", SCRIPT], "--run-path"),
        (["--virtual-local-rank", SCRIPT], "--virtual-local-rank"),
        (["--module", "--no-python", "x"], "--no-python"),
    ],
)
def test_bad_targets_are_usage_errors(args: list[str], needle: str) -> None:
    with pytest.raises(UsageError, match="expected") as e:
        target_of(parse(args))
    assert needle in str(e.value)


def _plan(*envs: dict[str, str]) -> LaunchPlan:
    return LaunchPlan(
        ranks=tuple(
            RankBinding(local_rank=i, gpu=None, cpus=(i,), mems=(0,), nic=None, env=e) for i, e in enumerate(envs)
        )
    )


def test_worker_env_lists_the_user_set_variables() -> None:
    plan = _plan({"OMP_NUM_THREADS": "4", "NCCL_IB_HCA": "mlx5_0"}, {"OMP_NUM_THREADS": "4", "NCCL_IB_HCA": "mlx5_1"})
    env = worker_env(plan, given(strict_binding=True), {"NCCL_IB_HCA": "mine"}, plan_path="/p/plan.json")
    assert env == {
        "NUMARUN_PLAN": "/p/plan.json",
        "NUMARUN_USER_ENV": "NCCL_IB_HCA",
        "NUMARUN_STRICT_BINDING": "1",
        "OMP_NUM_THREADS": "4",
    }
    env = worker_env(plan, given(), {"OMP_NUM_THREADS": "8"}, plan_path="/p/plan.json")
    assert env == {"NUMARUN_PLAN": "/p/plan.json", "NUMARUN_USER_ENV": "OMP_NUM_THREADS"}


@pytest.mark.slow
def test_plan_file_is_private_and_reads_back(tmp_path: Path) -> None:
    from numarun.launch.supervisor import Supervisor

    sup = Supervisor()
    plan = _plan({"OMP_NUM_THREADS": "1"})
    try:
        sup.start()
        path = sup.write_plan(plan.to_json())
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert LaunchPlan.from_json(path.read_text()) == plan
        used = sup.write_plan(plan.to_json(), tmp_path)
        assert used.parent == path.parent  # the workers' copy stays private, also with a run dir
        kept = tmp_path / "numarun_plan.json"  # the record of the job
        assert kept.stat().st_mode & 0o777 == 0o600 and LaunchPlan.from_json(kept.read_text()) == plan
        assert sup.write_plan(plan.to_json(), tmp_path) == used and kept.exists()  # a second job in the same dir
    finally:
        sup.close()
    assert not path.parent.exists()


@pytest.mark.slow
def test_nodes_sharing_a_run_dir_keep_their_own_plans(tmp_path: Path) -> None:
    """On a shared filesystem every node of a job writes into one run dir: a node's workers
    must read that node's plan, never the plan of the node that wrote last."""
    from numarun.launch.supervisor import Supervisor

    sup = Supervisor()
    plans = [_plan({"OMP_NUM_THREADS": str(n)}) for n in (1, 2)]
    try:
        sup.start()
        used = [sup.write_plan(p.to_json(), tmp_path, node=f"node{i}") for i, p in enumerate(plans)]
        assert LaunchPlan.from_json(used[0].read_text()) == plans[1]  # one numarun: one private file
    finally:
        sup.close()
    for i, p in enumerate(plans):
        assert LaunchPlan.from_json((tmp_path / f"numarun_plan.node{i}.json").read_text()) == p
    assert not (tmp_path / "numarun_plan.json").exists()


@pytest.mark.slow
def test_a_run_leaves_the_environment_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.launch.supervisor import Supervisor, scoped_environ

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    with scoped_environ({"NUMARUN_PLAN": "/nowhere", "OMP_NUM_THREADS": "3"}):
        os.environ["SET_INSIDE"] = "1"  # as torchrun sets OMP_NUM_THREADS for its workers
        os.environ["HOME"] = "/elsewhere"
    assert dict(os.environ) == before
    import signal

    from numarun.launch import signals

    saved = {s: signal.getsignal(s) for s in signals.RELAYED}
    sup = Supervisor()
    sup.hold_signals({})
    spec = LaunchSpec(target=Target("module", "x"), nproc_per_node=2, nnodes=NodeRange(2, 1, "2:1"))
    try:
        # a run that fails at once: torchrun refuses a min > max --nnodes range before starting workers
        with pytest.raises(AssertionError, match="min_nodes"):
            sup.run(spec, {"NUMARUN_PLAN": "/nowhere", "OMP_NUM_THREADS": "3"})
    finally:
        sup.close()
        sup.loop.close()
        for s, h in saved.items():
            signal.signal(s, h)
    assert dict(os.environ) == before


def test_pet_environment_sets_the_rank_count() -> None:
    assert options([SCRIPT], {"PET_NPROC_PER_NODE": "3"}).nproc_per_node == 3
    assert options([SCRIPT], {"PET_NPROC_PER_NODE": "gpu"}).nproc_per_node == "gpu"  # resolved on the topology
    with pytest.raises(UsageError, match="bad PET_NPROC_PER_NODE '0': expected a positive integer"):
        options([SCRIPT], {"PET_NPROC_PER_NODE": "0"})
