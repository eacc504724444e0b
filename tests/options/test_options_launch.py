"""The launch options, one value per field with its source: the command line, the environment (PET_*,
NUMARUN_*), the job config's launcher group, the job numarun runs in, the defaults (torch's for
torchrun's options). Every field of the launcher group against every pair of sources; every other
torchrun option against the command line and PET_*; the job fixing the world's shape; and the dry run
showing it all (end to end)."""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from helpers import REPO
from schedulers import slurm_env

from numarun.argtypes import ONE_NODE, NodeRange
from numarun.cli import build_parser
from numarun.errors import JobConflict, UsageError
from numarun.jobenv import detect
from numarun.launch.hangs import OnHang
from numarun.layout import Layout
from numarun.options.choices import StepReport
from numarun.options.launch import DECLARED, LaunchOptions, Source, config_keys, from_args
from numarun.options.torchrun import torchrun_record
from numarun.plan.model import BindingMode, MemPolicy, NicPolicy
from numarun.torch_private import installed_torch_version

SCRIPT = "tests/support/scripts/exit_rank.py"
TORCH = f"torch {installed_torch_version()}"


class Case(NamedTuple):
    cli: list[str]
    cli_value: Any
    env: str
    env_text: str
    env_value: Any
    config: Any
    config_value: Any
    default: Any
    owner: str


# the command line gives each field its default value where it can: it must win all the same
FIELDS: dict[str, Case] = {
    "nproc_per_node": Case(["--nproc-per-node", "1"], 1, "PET_NPROC_PER_NODE", "cpu", "cpu", 3, 3, None, "numarun"),
    "nnodes": Case(
        ["--nnodes", "1:1"], ONE_NODE, "PET_NNODES", "2", NodeRange(2, 2), 3, NodeRange(3, 3), ONE_NODE, TORCH
    ),
    "node_rank": Case(["--node-rank", "0"], 0, "PET_NODE_RANK", "1", 1, 2, 2, 0, TORCH),
    "binding": Case(
        ["--binding", "exclusive"],
        BindingMode.EXCLUSIVE,
        "NUMARUN_BINDING",
        "socket",
        BindingMode.SOCKET,
        "node",
        BindingMode.NODE,
        BindingMode.EXCLUSIVE,
        "numarun",
    ),
    "mem_policy": Case(
        ["--mem-policy", "bind"],
        MemPolicy.BIND,
        "NUMARUN_MEM_POLICY",
        "none",
        MemPolicy.NONE,
        "preferred",
        MemPolicy.PREFERRED,
        MemPolicy.BIND,
        "numarun",
    ),
    "nic_policy": Case(
        ["--nic-policy", "node"],
        NicPolicy.NODE,
        "NUMARUN_NIC_POLICY",
        "per-rank",
        NicPolicy.PER_RANK,
        "per-rank",
        NicPolicy.PER_RANK,
        NicPolicy.NODE,
        "numarun",
    ),
    "master_addr": Case(
        ["--master-addr", "127.0.0.1"],
        "127.0.0.1",
        "PET_MASTER_ADDR",
        "h-env",
        "h-env",
        "h-config",
        "h-config",
        "127.0.0.1",
        TORCH,
    ),
    "master_port": Case(
        ["--master-port", "29500"], 29500, "PET_MASTER_PORT", "29502", 29502, 29503, 29503, None, TORCH
    ),
    "rdzv_endpoint": Case(
        ["--rdzv-endpoint", "h1:1"], "h1:1", "PET_RDZV_ENDPOINT", "h2:2", "h2:2", "h3:3", "h3:3", "", TORCH
    ),
    "rdzv_id": Case(
        ["--rdzv-id", "none"], "none", "PET_RDZV_ID", "id-env", "id-env", "id-config", "id-config", "none", TORCH
    ),
    "strict_binding": Case(
        ["--strict-binding"], True, "NUMARUN_STRICT_BINDING", "0", False, True, True, False, "numarun"
    ),
    "mesh": Case(  # the text is read once, where the options are: the value is the layout
        ["--mesh", "tp=2"],
        Layout.parse("tp=2"),
        "NUMARUN_MESH",
        "dp_shard=-1,tp=2",
        Layout.parse("dp_shard=-1,tp=2"),
        "pp=2,tp=-1",
        Layout.parse("pp=2,tp=-1"),
        None,
        "numarun",
    ),
    "hang_timeout": Case(
        ["--hang-timeout", "300"], 300.0, "NUMARUN_HANG_TIMEOUT", "20", 20.0, 45, 45.0, 300.0, "numarun"
    ),
    "on_hang": Case(
        ["--on-hang", "report"],
        OnHang.REPORT,
        "NUMARUN_ON_HANG",
        "stop",
        OnHang.STOP,
        "stop",
        OnHang.STOP,
        OnHang.REPORT,
        "numarun",
    ),
    "step_report": Case(
        ["--step-report", "on"],
        StepReport.ON,
        "NUMARUN_STEP_REPORT",
        "off",
        StepReport.OFF,
        "off",
        StepReport.OFF,
        StepReport.ON,
        "numarun",
    ),
}
SOURCES = (Source.COMMAND_LINE, Source.ENVIRONMENT, Source.CONFIG, Source.DEFAULT)


def options(
    cli: list[str] = (), environ: dict[str, str] | None = None, config: dict[str, Any] | None = None
) -> LaunchOptions:
    opts = from_args(build_parser(only="run").parse_args(["run", *cli, SCRIPT]), environ or {})
    return opts.with_config(config) if config is not None else opts


def test_the_matrix_holds_every_field_of_the_launcher_group() -> None:
    assert set(FIELDS) == {k for k, _ in config_keys()}


@pytest.mark.parametrize("dest", FIELDS)
@pytest.mark.parametrize("pair", list(itertools.combinations(SOURCES, 2)), ids=lambda p: f"{p[0].name}-{p[1].name}")
def test_the_higher_source_of_each_pair_wins(dest: str, pair: tuple[Source, Source]) -> None:
    case = FIELDS[dest]
    opts = options(
        case.cli if Source.COMMAND_LINE in pair else [],
        {case.env: case.env_text} if Source.ENVIRONMENT in pair else {},
        {dest: case.config} if Source.CONFIG in pair else None,
    )
    want = {
        Source.COMMAND_LINE: (case.cli_value, case.cli[0]),
        Source.ENVIRONMENT: (case.env_value, case.env),
        Source.CONFIG: (case.config_value, f"launcher.{dest}"),
        Source.DEFAULT: (case.default, case.owner),
    }
    top = max(pair)
    s = opts.setting(dest)
    assert (s.value, s.source, s.where) == (*want[top][:1], top, want[top][1])
    assert (dest in opts.stated()) is (top is not Source.DEFAULT and s.value is not None)


def _sample(field: Any) -> tuple[str, Any]:
    """A value of the field's type (as torchrun's parser types it), as text and as parsed."""
    if field.switch:
        return "1", True
    kind = {r["dest"]: r["type"] for r in torchrun_record()}[field.dest]
    if kind == "int":
        return "7", 7
    if kind == "float":
        return "0.5", 0.5
    return {"start_method": ("fork", "fork")}.get(field.dest, ("x", "x"))


def test_every_other_torchrun_option_reads_the_command_line_then_pet() -> None:
    others = [f for f in options().taken if f.launch and f.dest not in FIELDS and f.dest != "topology"]
    assert {f.dest for f in others} >= {"rdzv_backend", "standalone", "max_restarts", "monitor_interval", "log_dir"}
    for f in others:
        assert f.variable == "PET_" + f.dest.upper() and f.owner == TORCH
        text, value = _sample(f)
        s = options([], {f.variable: text}).setting(f.dest)
        assert (s.value, s.source, s.where) == (value, Source.ENVIRONMENT, f.variable), f.dest
        cli = [f.flag] if f.switch else [f"{f.flag}={text}"]
        s = options(cli, {f.variable: "0" if f.switch else text}).setting(f.dest)
        assert (s.value, s.source, s.where) == (value, Source.COMMAND_LINE, f.flag), f.dest
        assert options().setting(f.dest).source is Source.DEFAULT


def test_torchruns_defaults_are_torchs_own() -> None:
    from torch.distributed.run import get_args_parser

    real = {a.dest: a.default for a in get_args_parser()._actions}
    for f in options().taken:
        if f.owner == TORCH:  # read as argparse reads a default given as text
            want = f.read(real[f.dest], f.owner) if f.parse and isinstance(real[f.dest], str) else real[f.dest]
            assert f.default == want, f.dest
    assert options().master_port is None  # torch's, not the 29500 its rendezvous picks


@pytest.mark.parametrize(
    ("environ", "config", "message"),
    [
        ({"NUMARUN_BINDING": "tight"}, None, "bad NUMARUN_BINDING 'tight': expected one of"),
        ({"PET_MASTER_PORT": "x"}, None, "bad PET_MASTER_PORT 'x': expected a whole number from 1 to 65535"),
        ({"PET_MAX_RESTARTS": "x"}, None, "bad PET_MAX_RESTARTS 'x': expected an integer"),
        ({"PET_STANDALONE": "yes"}, None, "bad PET_STANDALONE 'yes': expected 1 or 0"),
        ({}, {"binding": "tight"}, "bad launcher.binding 'tight': expected one of"),
        ({}, {"nproc_per_node": 0}, "bad launcher.nproc_per_node '0': expected a positive integer"),
    ],
)
def test_a_bad_value_names_its_source(environ: dict[str, str], config: dict[str, Any] | None, message: str) -> None:
    with pytest.raises(UsageError, match=message) as e:
        options([], environ, config)
    assert "\n" not in str(e.value)


def test_an_empty_variable_is_not_set() -> None:
    assert options([], {"PET_NNODES": " ", "NUMARUN_BINDING": ""}).stated() == {}


# ----------------------------------------------------------------------------- the job fixes the world's shape

OMPI_NODE = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
}
"""Node 1 of 2 under mpirun, one process per node: numarun starts the node's ranks (per-node mode)."""

SHAPE = {  # field: (agreeing value by source, contradicting value by source, its name in the error)
    "nnodes": (
        {"cli": ["--nnodes", "2"], "env": ("PET_NNODES", "2"), "config": 2},
        {"cli": ["--nnodes", "3"], "env": ("PET_NNODES", "3"), "config": 3},
    ),
    "node_rank": (
        {"cli": ["--node-rank", "1"], "env": ("PET_NODE_RANK", "1"), "config": 1},
        {"cli": ["--node-rank", "0"], "env": ("PET_NODE_RANK", "0"), "config": 0},
    ),
}


def _from(source: str, dest: str, given: dict[str, Any]) -> LaunchOptions:
    base = ["--nproc-per-node", "2"]
    if source == "cli":
        return options([*base, *given["cli"]])
    if source == "env":
        return options(base, dict([given["env"]]))
    return options(base, {}, {dest: given["config"]})


@pytest.mark.parametrize("dest", SHAPE)
@pytest.mark.parametrize("source", ["cli", "env", "config"])
def test_the_job_fixes_the_shape_and_a_contradiction_names_its_source(dest: str, source: str) -> None:
    from numarun.launch.planning import settle

    job = detect(OMPI_NODE, nproc_given=True)
    agree, contradict = SHAPE[dest]
    kept = settle(_from(source, dest, agree).with_job_env(OMPI_NODE), job, OMPI_NODE).options.setting(dest)
    assert kept.source is {"cli": Source.COMMAND_LINE, "env": Source.ENVIRONMENT, "config": Source.CONFIG}[source]
    with pytest.raises(JobConflict) as e:
        settle(_from(source, dest, contradict).with_job_env(OMPI_NODE), job, OMPI_NODE)
    where = {"cli": contradict["cli"][0], "env": contradict["env"][0], "config": f"launcher.{dest}"}[source]
    assert str(e.value).startswith(f"bad {where} ") and "\n" not in str(e.value)


def test_what_no_source_gave_comes_from_the_job() -> None:
    from numarun.launch.planning import settle

    job = detect(OMPI_NODE, nproc_given=True)
    settled = settle(options(["--nproc-per-node", "2"]).with_job_env(OMPI_NODE), job, OMPI_NODE).options
    for dest, value in (("nnodes", NodeRange(2, 2)), ("node_rank", 1), ("master_port", 29500)):
        s = settled.setting(dest)
        assert (s.value, s.source) == (value, Source.JOB) and s.where.startswith("Open MPI job"), dest
    # the launcher's MASTER_ADDR (mpirun -x): the environment's, below PET_MASTER_ADDR
    s = settled.setting("master_addr")
    assert (s.value, s.source, s.where) == ("127.0.0.1", Source.ENVIRONMENT, "MASTER_ADDR")
    s = settle(options([], {"PET_MASTER_ADDR": "h-pet"}).with_job_env(OMPI_NODE), job, OMPI_NODE).options.setting(
        "master_addr"
    )
    assert (s.value, s.where) == ("h-pet", "PET_MASTER_ADDR")
    s = settle(
        options(["--nproc-per-node", "2"], {}, {"master_port": 29511}).with_job_env(OMPI_NODE), job, OMPI_NODE
    ).options.setting("master_port")
    assert (s.value, s.source) == (29511, Source.CONFIG)  # above the job's derived port


def test_a_slurm_step_refuses_a_variable_that_contradicts_it_on_the_node_that_can_tell() -> None:
    from numarun.jobenv.settle import settle_node

    stated = options([], {"PET_NODE_RANK": "0"}).stated()
    settle_node(detect(slurm_env(0)), stated)
    with pytest.raises(JobConflict, match="bad PET_NODE_RANK 0: this task runs on node3") as e:
        settle_node(detect(slurm_env(1)), stated)
    assert e.value.node_varying


# ----------------------------------------------------------------------------- end to end: the dry run


def _numarun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NUMARUN_", "PET_", "SLURM_", "OMPI_", "PMI"))}
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )


def _shown(out: str, dest: str) -> str:
    """The value and source the ``# options`` block shows for ``dest``, spaces squeezed."""
    return " ".join(next(line for line in out.splitlines() if line.startswith(f"#   {dest} ")).split()[2:])


@pytest.mark.slow
def test_a_flag_given_with_its_default_value_beats_the_job_config(tmp_path: Path) -> None:
    r = _numarun(
        "--dry-run",
        "--binding",
        "exclusive",
        "scripts/train.py",
        "launcher=cpu2",
        "launcher.binding=node",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "binding exclusive" in r.stdout and "binding node" not in r.stdout  # the plan's header
    assert _shown(r.stdout, "binding") == "exclusive command line (--binding)"
    assert _shown(r.stdout, "nproc_per_node") == "2 job config (launcher.nproc_per_node)"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_dry_run_shows_the_environment_and_the_defaults() -> None:
    r = _numarun("--dry-run", SCRIPT, env={"PET_NPROC_PER_NODE": "2", "NUMARUN_MEM_POLICY": "preferred"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert _shown(r.stdout, "nproc_per_node") == "2 environment (PET_NPROC_PER_NODE)"
    assert _shown(r.stdout, "mem_policy") == "preferred environment (NUMARUN_MEM_POLICY)"
    assert _shown(r.stdout, "rdzv_backend") == f"static default ({TORCH})"
    assert "--nproc-per-node=2 " in r.stdout.splitlines()[-1] and "memory preferred" in r.stdout


@pytest.mark.slow
def test_per_rank_dry_run_refuses_a_variable_contradicting_the_job_in_one_line() -> None:
    ranks = {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    r = _numarun("--dry-run", SCRIPT, env={**ranks, "PET_NNODES": "3"})
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("numarun: error: bad PET_NNODES '3'")
    r = _numarun("--dry-run", SCRIPT, env=ranks)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _shown(r.stdout, "nnodes") == "1 job (Open MPI job)" and _shown(r.stdout, "nproc_per_node").startswith(
        "2 job"
    )
    assert "RANK=0" in r.stdout.splitlines()[-1]


@pytest.mark.slow
def test_a_per_rank_mpi_dry_run_of_several_nodes_shows_no_node_it_cannot_know() -> None:
    """Rank 2 of 4 under mpirun, two per node: which node it is on, the ranks agree when they start; a dry run,
    which starts nothing, says so instead of GROUP_RANK=-1 and a node count of 0."""
    ranks = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
    }
    r = _numarun("--dry-run", SCRIPT, env=ranks)
    assert r.returncode == 0, r.stderr[-2000:]
    command = r.stdout.splitlines()[-1]
    assert "GROUP_RANK" not in command and "GROUP_WORLD_SIZE" not in command and "RANK=2 " in command, command
    assert "# GROUP_RANK and GROUP_WORLD_SIZE (this node's index and the node count): agreed by the ranks" in r.stdout
    assert (
        _shown(r.stdout, "nnodes") == f"1:1 default ({TORCH})"
        and _shown(r.stdout, "node_rank") == f"0 default ({TORCH})"
    )
    assert _shown(r.stdout, "master_addr") == "127.0.0.1 environment (MASTER_ADDR)"  # mpirun -x MASTER_ADDR


@pytest.mark.slow
def test_plan_shows_the_sources_on_stderr() -> None:
    r = _numarun("plan", "--json", "--show-sources", "--nproc-per-node", "1", env={"NUMARUN_BINDING": "node"})
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), r.stderr[-2000:]
    assert _shown(r.stderr, "binding") == "node environment (NUMARUN_BINDING)"
    assert _shown(r.stderr, "nproc_per_node") == "1 command line (--nproc-per-node)"


# ----------------------------------------------------------------------------- one declaration, the real config groups


@pytest.mark.parametrize(
    ("overrides", "binding", "nproc"),
    [
        ([], ("exclusive", Source.DEFAULT, "numarun"), (None, Source.DEFAULT, "numarun")),
        (["launcher=cpu2"], ("exclusive", Source.DEFAULT, "numarun"), (2, Source.CONFIG, "launcher.nproc_per_node")),
        (["launcher.binding=node"], ("node", Source.CONFIG, "launcher.binding"), (None, Source.DEFAULT, "numarun")),
    ],
    ids=["local", "cpu2", "override"],
)
def test_the_real_launcher_groups_state_only_what_they_set(
    tmp_path: Path, overrides: list[str], binding: tuple, nproc: tuple
) -> None:
    """The trainer's composed ``launcher`` group (configs/launcher/*.yaml over the schema): a key nobody set is
    null, and its option's default is the declared one, shown as a default, never as the job config's."""
    from numarun.config.compose import compose_dry

    ((_, job),) = compose_dry([*overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    opts = options().with_config(job.launcher)
    s = opts.setting("binding")
    assert (s.value.value, s.source, s.where) == binding
    s = opts.setting("nproc_per_node")
    assert (s.value, s.source, s.where) == nproc
    assert all(
        s.source is not Source.CONFIG for d, s in opts.settings.items() if d not in ("binding", "nproc_per_node")
    )
    assert not (tmp_path / "run").exists()


def test_every_option_is_declared_once_and_its_default_stated_once() -> None:
    import dataclasses as dc

    import yaml

    from numarun.config.schema import LauncherConfig

    assert len({o.dest for o in DECLARED}) == len(DECLARED)
    # the job config's launcher group is made from the declarations: a key each, every one null
    assert [(f.name, f.default) for f in dc.fields(LauncherConfig)] == [(k, None) for k, _ in config_keys()]
    for path in sorted((REPO / "configs" / "launcher").glob("*.yaml")):  # no file restates a default
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            default = next(o.default for o in DECLARED if o.dest == key)
            assert value is None or value != getattr(default, "value", default), (path.name, key)
    # the help says the default, from the declaration
    binding = next(o for o in DECLARED if o.dest == "binding")
    assert binding.help_text().endswith("(default: $NUMARUN_BINDING, else exclusive)")
    source = "\n".join(p.read_text() for p in (REPO / "launcher").rglob("*.py"))
    assert source.count("BindingMode.EXCLUSIVE") == 1 and source.count('"exclusive"') == 1  # plan/model.py's


def test_every_command_takes_the_shared_options_from_the_one_declaration() -> None:
    """No command declares a launch option's flag of its own: run, plan, doctor, tune, bench, submit and topo
    hold each flag with the declaration's dest and spellings (tune: a list of the values to try)."""
    from numarun.cli import build_parser
    from numarun.options.launch import option

    def actions(command: str, *sub: str) -> dict[str, Any]:
        parser = build_parser(only=command)
        p = next(a for a in parser._actions if a.dest == "command").choices[command]
        for name in sub:
            p = next(a for a in p._actions if a.dest == "benchmark").choices[name]
        return {s: a for a in p._actions for s in a.option_strings}

    shared = {
        "run": ("topology", "nproc_per_node", "binding", "master_port", "strict_binding"),
        "plan": ("topology", "nproc_per_node", "binding", "nic_policy"),
        "topo": ("topology",),
        "doctor": ("topology", "binding", "nnodes", "master_addr", "master_port"),
        "tune": ("topology", "nproc_per_node", "binding", "mem_policy"),
        "bench": ("nproc_per_node", "nnodes", "master_port", "binding"),
        "submit": ("nnodes", "nproc_per_node"),
    }
    for command, dests in shared.items():
        found = actions(command, *(["allreduce"] if command == "bench" else []))
        for dest in dests:
            for flag in option(dest).flags:
                assert found[flag].dest == dest, (command, flag)
            if command != "tune":  # tune's --binding and --mem-policy: lists to try, the same spellings
                assert found[option(dest).flag].default is argparse.SUPPRESS, (command, dest)
        assert "--show-sources" in found, command


LAUNCHER = REPO / "launcher"


def _modules_naming(name: str) -> list[str]:
    """The package's modules that name ``name`` (a call, a reference, an import), its definition aside."""
    import ast

    return sorted(
        str(path.relative_to(LAUNCHER))
        for path in LAUNCHER.rglob("*.py")
        if any(
            (isinstance(n, ast.Name) and n.id == name)
            or (isinstance(n, ast.Attribute) and n.attr == name)
            or (isinstance(n, ast.alias) and n.name == name)
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )


def test_nnodes_is_read_once_into_a_typed_range() -> None:
    """``--nnodes`` (``PET_NNODES``, ``launcher.nnodes``) is read where the options are read, into a NodeRange
    that every later step takes typed: its reader has one user, the option's declaration."""
    import typing

    assert _modules_naming("node_range") == ["options/launch.py"]
    assert typing.get_type_hints(LaunchOptions)["nnodes"] is NodeRange
    assert options(["--nnodes", "2:4"]).nnodes == NodeRange(2, 4) and str(options(["--nnodes", "2:2"]).nnodes) == "2:2"
    assert options([], {"PET_NNODES": "3"}).nnodes == NodeRange(3, 3)
    assert options([], {}, {"nnodes": 2}).nnodes == NodeRange(2, 2) and options().nnodes == ONE_NODE
    assert 3 in NodeRange(2, 4) and 5 not in NodeRange(2, 4) and NodeRange(1, 4).elastic
    with pytest.raises(UsageError, match=r"^bad PET_NNODES '2:1': expected N or MIN:MAX with 1 <= MIN <= MAX"):
        options([], {"PET_NNODES": "2:1"})


def test_no_argparse_namespace_past_the_options_layer() -> None:
    """The command line is parsed by the CLI and the commands, into typed options (the options layer); what runs
    the launch, the doctor, a sweep or the plan takes those, never the parsed namespace. argparse is left to the
    commands, the options and the entries with command lines of their own (a benchmark's, a Slurm node's, Hydra's
    parser)."""
    own_parsers = {"bench/allreduce.py", "bench/h2d.py", "slurm/node.py", "hydra_internals.py"}
    users = {m for m in _modules_naming("argparse") if not m.startswith(("commands/", "options/"))}
    assert users - own_parsers == {"argtypes.py", "cli.py"}  # not the doctor, a sweep, the launch
