"""The options of a launch, typed and built once per command: :class:`LaunchOptions`, each value with its source.

An option is declared once, as a field of :class:`LaunchOptions`: its name is the option's dest, its annotation the
value's type, and :func:`declare` holds the rest (flags, variable, key in a job config's ``launcher`` group, default,
how its text is read, help). torchrun's options are torch's own (its parser, read once per torch version:
:func:`~numarun.options.torchrun.torchrun_record`): a field that names no flags adopts torchrun's option of that
name and adds what numarun gives it (a type, a job-config key, a scheduler's variable, a meaning in per-rank mode);
torchrun's others pass through as torch's parser types them (:attr:`LaunchOptions.settings`).

Every command takes its flags from here (:func:`add_options`); the parser keeps only what was typed, and
:func:`from_args` adds the environment and the defaults; :meth:`LaunchOptions.with_config` a job config's
``launcher`` group and :meth:`LaunchOptions.with_job` what the job numarun runs in fixes. The precedence
(:func:`resolve`) is the table of docs/run.md, "Where each option comes from".

The variables: ``NUMARUN_<NAME>`` for numarun's options, ``PET_<NAME>`` for torchrun's, as torchrun reads them. A
switch reads one rule per family (:func:`read_switch`): ``NUMARUN_*`` takes ``1``/``0``, ``true``/``false``,
``yes``/``no``, ``on``/``off`` (any case); ``PET_*`` an integer, as torchrun's ``check_env`` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .. import argtypes, envvars
from ..errors import UsageError
from ..layout import DIMS, Layout
from .choices import (
    DEFAULT_TIMEOUT_S,
    EXIT_HANG,
    BindingMode,
    MemPolicy,
    NicPolicy,
    OnHang,
    StepReport,
    parse_hang_timeout,
    parse_nproc,
)

NOT_LAUNCH = (
    "help",
    "module",
    "no_python",
    "run_path",
    "virtual_local_rank",
    "training_script",
    "training_script_args",
)
"""torchrun's options that choose the program, not the launch."""


class Source(enum.IntEnum):
    """Where an option's value came from; a higher source wins."""

    DEFAULT = 0
    JOB = 1
    CONFIG = 2
    ENVIRONMENT = 3
    COMMAND_LINE = 4

    def __str__(self) -> str:
        return self.name.lower().replace("_", " ").replace("config", "job config")


@dataclass(frozen=True)
class Setting:
    """One option's value, its source, and where in that source: ``--nnodes``, ``PET_NNODES``,
    ``launcher.nnodes``, the job (``Slurm step 12.0``) or the default's owner (``torch 2.13.0``)."""

    value: Any
    source: Source
    where: str


SWITCH_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
"""What a ``NUMARUN_*`` switch reads, any case."""


def read_switch(raw: object, where: str, *, torchrun: bool = False) -> bool:
    """A switch's value: ``NUMARUN_*`` (and a job config) by :data:`SWITCH_WORDS`; torchrun's ``PET_*`` as an
    integer (torchrun's ``check_env``: ``bool(int(...))``); one line naming ``where`` for anything else."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip()
    if torchrun:
        if not text.lstrip("-").isdigit():
            raise UsageError(f"bad {where} {text!r}: expected 1 or 0")
        return bool(int(text))
    if text.lower() not in SWITCH_WORDS:
        raise UsageError(f"bad {where} {text!r}: expected 1 or 0 (or true/false, yes/no, on/off)")
    return SWITCH_WORDS[text.lower()]


@dataclass(frozen=True)
class Option:
    """One option's declaration (:func:`declare`); torchrun's own are made from its parser."""

    dest: str
    flags: tuple[str, ...] = ()
    """Its spellings, the first ``--`` one named in messages; () adopts torchrun's option of that dest."""
    default: Any = None
    parse: argtypes.Reader[Any] | None = None
    """Its text (a flag's, a variable's, a config value's) to its value, the error naming where the text came from;
    None: the text is the value."""
    read_late: bool = False
    """Its flag's text too is read by :func:`from_args`, not by argparse: the reader's error names its docs page (the
    layout's), which argparse's line would leave out."""
    help: str = ""
    metavar: str | None = None
    switch: bool = False
    env: str | None = ""
    """The variable that sets it; '' for ``NUMARUN_<DEST>`` (torchrun's: ``PET_<DEST>``); None for none."""
    config: type | None = None
    """The type of its key ``launcher.<dest>`` in a job config; None: no key."""
    job_env: str = ""
    """A scheduler's variable that sets it inside a job numarun found (``mpirun -x MASTER_ADDR``)."""
    per_rank: bool = False
    """Meaningful when the scheduler starts every rank itself (per-rank mode, no torchrun agent)."""
    planning: bool = False
    """An input of the plan: ``numarun plan``, the doctor and ``tune`` take it too."""
    launch: bool = True
    """An option of the launch (listed with its source, handed on to a child ``numarun run``); False: a setting of
    the command itself (``--no-detect``, ``--plan-file``, ``--log-level``)."""
    default_text: str = ""
    """What the help says a None default means."""
    owner: str = "numarun"
    """Whose default it is: ``numarun`` or ``torch <version>``."""

    @property
    def flag(self) -> str:
        return next((s for s in self.flags if s.startswith("--")), self.flags[0] if self.flags else "--" + self.dest)

    @property
    def variable(self) -> str:
        """Its variable ('' for none)."""
        if self.env is None:
            return ""
        return self.env or ("PET_" if self.owner != "numarun" else "NUMARUN_") + self.dest.upper()

    def read(self, raw: object, where: str) -> Any:
        """``raw`` (a variable's text, a config value) as the option's type; one line naming ``where`` if it is not
        one."""
        if self.switch:
            return read_switch(raw, where, torchrun=self.owner != "numarun")
        return str(raw) if self.parse is None else self.parse(str(raw), where)

    def help_text(self) -> str:
        if self.switch and self.default:  # its flag turns it off
            return f"{self.help} (also ${self.variable}=0)"
        shown = self.default_text or ("off" if self.switch and not self.default else _text(self.default))
        return f"{self.help} (default: ${self.variable}, else {shown})" if self.variable else self.help

    def add_to(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """Its flags on ``parser``, with no default: what was not typed is left out of the parsed namespace."""
        how: dict[str, Any] = (
            {"action": "store_false" if self.default else "store_true"}
            if self.switch
            else {
                "type": str if self.read_late else argtypes.typed(self.flag, self.read),
                "metavar": self.metavar,
                "action": Spelled,
            }
        )
        text = self.help_text() if self.owner == "numarun" else self.help
        parser.add_argument(*self.flags, dest=self.dest, default=argparse.SUPPRESS, help=text, **how)


def declare(*flags: str, default: Any = None, **more: Any) -> Any:
    """A field of :class:`LaunchOptions` and its option's declaration (:class:`Option`'s attributes; no flags:
    torchrun's option of the field's name). The field's name is the dest, its annotation the value's type."""
    return field(default=default, metadata={"option": Option("", flags, default, **more)})


def _choices(kind: type[enum.Enum]) -> str:
    return ", ".join(m.value for m in kind)


def _log_level(text: str, where: str) -> str:
    if not isinstance(logging.getLevelName(text.upper()), int):
        raise UsageError(f"bad {where} {text!r}: expected DEBUG, INFO, WARNING or ERROR")
    return text.upper()


def _number(kind: type[int] | type[float]) -> argtypes.Reader[Any]:
    """The reader of a torchrun option its parser types ``int`` or ``float``."""
    return argtypes.converted(kind, "an integer" if kind is int else "a number")


@dataclass(frozen=True)
class LaunchOptions:
    """Every option of a command, typed (``options.binding`` is a :class:`BindingMode`), each with its source
    (:meth:`setting`). The fields are the declarations, in the order ``--show-sources`` lists them; build it with
    :func:`from_args` (or :func:`from_environ`, :func:`given`) and change it with the ``with_*`` methods, which keep
    each value beside its source."""

    topology: str | None = declare(
        "--topology",
        env=envvars.TOPOLOGY,
        metavar="PATH",
        per_rank=True,
        planning=True,
        default_text="this machine",
        help="topology source: a machine root holding sys/ and proc/, a 'numarun topo --json' snapshot, "
        "hwloc XML, or saved 'nvidia-smi topo -m' text",
    )
    nproc_per_node: int | str | None = declare(
        "--nproc-per-node",
        "--nproc_per_node",
        env="PET_NPROC_PER_NODE",
        parse=parse_nproc,
        config=int,
        per_rank=True,
        planning=True,
        metavar="N",
        default_text="one per visible GPU, or 1 without GPUs",
        help="local ranks: a number, or torchrun's auto (one per GPU, else per CPU), gpu, cpu or xpu",
    )
    nnodes: argtypes.NodeRange = declare(
        default=argtypes.ONE_NODE, parse=argtypes.node_range, config=int, per_rank=True
    )
    node_rank: int | None = declare(config=int, per_rank=True)
    binding: BindingMode = declare(
        "--binding",
        "--numa-binding",
        "--numa_binding",
        default=BindingMode.EXCLUSIVE,
        parse=argtypes.member(BindingMode),
        config=str,
        per_rank=True,
        planning=True,
        metavar="MODE",
        help=f"CPU binding: {_choices(BindingMode)}",
    )
    mem_policy: MemPolicy = declare(
        "--mem-policy",
        default=MemPolicy.BIND,
        parse=argtypes.member(MemPolicy),
        config=str,
        per_rank=True,
        planning=True,
        metavar="POLICY",
        help=f"memory policy per rank: {_choices(MemPolicy)}",
    )
    nic_policy: NicPolicy = declare(
        "--nic-policy",
        default=NicPolicy.NODE,
        parse=argtypes.member(NicPolicy),
        config=str,
        per_rank=True,
        planning=True,
        metavar="POLICY",
        help="NCCL_IB_HCA/NCCL_SOCKET_IFNAME: 'node' = one list of the node's compute NICs for every rank; "
        "'per-rank' = each rank's closest NIC only",
    )
    mesh: Layout | None = declare(
        "--mesh",
        parse=Layout.parse,
        read_late=True,
        config=str,
        per_rank=True,
        planning=True,
        metavar="SPEC",
        default_text="none",
        help=f"parallel layout, outermost first, e.g. pp=2,dp_shard=-1,tp=4 (names {', '.join(DIMS)}; -1: the "
        "rest): each local rank drives the GPU that puts tp's groups on the fastest links, then cp's, "
        "dp_shard's and dp_replicate's (docs/layouts.md)",
    )
    master_addr: str | None = declare(config=str, per_rank=True, job_env="MASTER_ADDR")
    master_port: int | None = declare(parse=argtypes.PORT, config=int, per_rank=True, job_env="MASTER_PORT")
    rdzv_backend: str | None = declare()
    rdzv_endpoint: str | None = declare(config=str)
    rdzv_id: str | None = declare(config=str)
    standalone: bool = declare(default=False, per_rank=True)
    strict_binding: bool = declare(
        "--strict-binding",
        default=False,
        switch=True,
        config=bool,
        per_rank=True,
        help=f"a rank whose binding cannot be applied fails instead of running unbound (sets "
        f"{envvars.STRICT_BINDING}=1)",
    )
    hang_timeout: float = declare(
        "--hang-timeout",
        default=DEFAULT_TIMEOUT_S,
        parse=parse_hang_timeout,
        config=float,
        per_rank=True,
        metavar="SECONDS",
        help="print the roll-call of every rank when no rank entered or left a torch.distributed collective or "
        "took an optimizer step for this long while a rank's stack stood still (0: off)",
    )
    on_hang: OnHang = declare(
        "--on-hang",
        default=OnHang.REPORT,
        parse=argtypes.member(OnHang),
        config=str,
        per_rank=True,
        metavar="ACTION",
        help=f"after the roll-call: report (keep running) or stop (end the job, exit code {EXIT_HANG})",
    )
    step_report: StepReport = declare(
        "--step-report",
        default=StepReport.ON,
        parse=argtypes.member(StepReport),
        config=str,
        per_rank=True,
        metavar="ON|OFF",
        help="record where each rank's step time goes and, at the end, say which rank holds the job back and why "
        "(docs/steps.md); numarun top shows it live",
    )
    # ---- the commands' own settings (not the launch's: not listed with the options, nor handed on)
    detect: bool = declare(
        "--no-detect",
        default=True,
        switch=True,
        env=envvars.DETECT,
        launch=False,
        help="do not read the job's shape from a Slurm step or mpirun's environment",
    )
    plan_file: str | None = declare(
        "--plan-file",
        env=None,
        launch=False,
        metavar="PATH",
        help="use this saved plan ('numarun plan --json' output) instead of planning",
    )
    watch_interval: float | None = declare(
        "--watch-interval",
        env=None,
        parse=argtypes.duration(above=False),
        launch=False,
        metavar="SECONDS",
        help="seconds between the binding watcher's checks in every rank (default 30)",
    )
    log_level: str | None = declare(
        "--log-level",
        env=None,
        parse=_log_level,
        launch=False,
        per_rank=True,
        help="logging level of numarun itself (default WARNING); when given, also of each worker's "
        "bootstrap, whose default INFO shows the one binding line per rank",
    )
    show_sources: bool = declare(
        "--show-sources",
        switch=True,
        env=None,
        launch=False,
        help="also print each launch option with its value and source (on stderr)",
    )

    taken: tuple[Option, ...] = ()
    """The options this command takes (the others keep their defaults)."""
    settings: Mapping[str, Setting] = field(default_factory=dict)
    """Each taken option's value with its source, by dest: the fields' and torchrun's others (``max_restarts``...)."""

    @classmethod
    def of(cls, taken: Iterable[Option], settings: Mapping[str, Setting]) -> LaunchOptions:
        """The options ``settings`` give, each field's value from its setting."""
        return cls(**{d: s.value for d, s in settings.items() if d in _FIELDS}, taken=tuple(taken), settings=settings)

    def setting(self, dest: str) -> Setting:
        """The value of ``dest`` with its source."""
        if dest in self.settings or dest not in _FIELDS:
            return self.settings[dest]
        return Setting(getattr(self, dest), Source.DEFAULT, option(dest).owner)

    def stated(self) -> dict[str, Setting]:
        """The launch options a source other than the default gave."""
        return {
            d: s
            for d, s in self.settings.items()
            if s.source > Source.DEFAULT and s.value is not None and (d not in _FIELDS or option(d).launch)
        }

    def _with(self, settings: Iterable[tuple[str, Setting]], *, newer_wins: bool) -> LaunchOptions:
        """With ``settings`` in their place in the precedence; from the same source, the newer or the older wins."""
        merged = dict(self.settings)
        for dest, s in settings:
            merged[dest] = (
                (resolve(s, merged[dest]) if newer_wins else resolve(merged[dest], s)) if dest in merged else s
            )
        return LaunchOptions.of(self.taken, merged)

    def flags(self, *sources: Source, leave_out: Iterable[str] = ()) -> list[str]:
        """``--flag=value`` (a switch: ``--flag``) of each option a source of ``sources`` stated, for a ``numarun run``
        this command starts (what the environment gave reaches it by itself)."""
        out = []
        for dest, s in self.stated().items():
            if s.source in sources and dest not in leave_out:
                o = option(dest)
                out += ([o.flag] if s.value else []) if o.switch else [f"{o.flag}={_text(s.value)}"]
        return out

    def with_config(self, launcher: Mapping[str, Any], prefix: str = "launcher") -> LaunchOptions:
        """With a job config's ``launcher`` group (None: not set there) in its place in the precedence;
        ``prefix``: where the values are (``hydra.launcher`` for a sweep launcher's own)."""
        given = [
            (f.dest, Setting(f.read(value, f"{prefix}.{f.dest}"), Source.CONFIG, f"{prefix}.{f.dest}"))
            for f in self.taken
            if f.config is not None and (value := launcher.get(f.dest)) is not None
        ]
        return self._with(given, newer_wins=True)

    def with_job_env(self, environ: Mapping[str, str]) -> LaunchOptions:
        """Inside a job numarun found: the scheduler's variables its options read (``MASTER_ADDR``, ``MASTER_PORT``),
        below numarun's and torchrun's own (``PET_MASTER_ADDR``)."""
        given = [
            (f.dest, Setting(f.read(text, f.job_env), Source.ENVIRONMENT, f.job_env))
            for f in self.taken
            if f.job_env and (text := environ.get(f.job_env, "").strip())
        ]
        return self._with(given, newer_wins=False)

    def with_job(self, values: Mapping[str, Any], job: str) -> LaunchOptions:
        """With what the job fixes: a stated value that agrees keeps its source (one that contradicts the job
        was refused before, by :mod:`numarun.jobenv.settle`; here it can only change form, ``1:4`` to ``2``)."""
        settings = dict(self.settings)
        for dest, value in values.items():
            if dest in settings and (settings[dest].source is Source.DEFAULT or settings[dest].value != value):
                settings[dest] = Setting(value, Source.JOB, job)
        return LaunchOptions.of(self.taken, settings)

    def with_setting(self, dest: str, setting: Setting) -> LaunchOptions:
        """With ``setting`` for ``dest``, whatever gave it before (numarun's trainer hands its layout as the mesh)."""
        return LaunchOptions.of(self.taken, {**self.settings, dest: setting})

    def with_defaults(self, owner: str, **values: Any) -> LaunchOptions:
        """A command's own defaults in place of the declared ones (``numarun bench`` runs 2 ranks)."""
        return self._with(((d, Setting(v, Source.DEFAULT, owner)) for d, v in values.items()), newer_wins=True)

    def describe(self) -> str:
        """``# options`` and a line per declared launch option and per stated one, e.g.
        ``#   binding          node             job config (launcher.binding)``."""
        order, stated = [o.dest for o in DECLARED], self.stated()
        rows = sorted(
            ((d, s) for d, s in self.settings.items() if (d in stated or d in order) and d not in _COMMANDS),
            key=lambda r: order.index(r[0]) if r[0] in order else len(order),
        )
        return "# options (value, source):\n" + "".join(
            f"#   {d:<16} {_text(s.value):<16} {s.source} ({s.where})\n" for d, s in rows
        )

    def shown(self) -> LaunchOptions:
        """``--show-sources``: the options block on stderr; returns the options."""
        if self.show_sources:
            sys.stderr.write(self.describe())
        return self


DECLARED: tuple[Option, ...] = tuple(
    dataclasses.replace(f.metadata["option"], dest=f.name)
    for f in dataclasses.fields(LaunchOptions)
    if "option" in f.metadata
)
"""Every option numarun declares, in the order of :class:`LaunchOptions`' fields."""
_FIELDS = frozenset(o.dest for o in DECLARED)
_COMMANDS = frozenset(o.dest for o in DECLARED if not o.launch)
PLANNING = tuple(o.dest for o in DECLARED if o.planning)


def config_keys() -> tuple[tuple[str, type], ...]:
    """(key, type) of each option a job config's ``launcher`` group may set."""
    return tuple((o.dest, o.config) for o in DECLARED if o.config is not None)


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Option]:
    """Every launch option by dest: torchrun's (as its parser declares them), each adopted one with numarun's
    additions, then numarun's own."""
    from .torchrun import installed_torch_version, torchrun_record

    declared = {o.dest: o for o in DECLARED}
    claimed = {f for o in DECLARED for f in o.flags}  # torchrun's --numa-binding is numarun's --binding
    table: dict[str, Option] = {}
    for r in torchrun_record():
        if not r["flags"] or r["dest"] in NOT_LAUNCH or (r["dest"] not in declared and claimed & set(r["flags"])):
            continue
        kind = {"int": int, "float": float}.get(r["type"] or "")
        default = kind(r["default"]) if kind and isinstance(r["default"], str) else r["default"]  # as argparse does
        torch = Option(
            r["dest"],
            tuple(r["flags"]),
            default,
            _number(kind) if kind else None,
            help=r["help"] or "",
            metavar=r["metavar"],
            switch=r["nargs"] == 0,
            owner=f"torch {installed_torch_version()}",  # whose defaults they are
        )
        own = declared.get(r["dest"])
        if own is not None and not own.flags:  # adopted: torchrun's flags and default, numarun's additions
            parse = own.parse or torch.parse
            torch = dataclasses.replace(
                own,
                flags=torch.flags,
                default=parse(default, torch.owner) if parse and isinstance(default, str) else default,  # as argparse
                parse=parse,
                help=torch.help,
                metavar=torch.metavar,
                switch=torch.switch,
                owner=torch.owner,
            )
        table[r["dest"]] = torch
    table.update((o.dest, o) for o in DECLARED if o.flags)
    return table


def option(dest: str) -> Option:
    own = next((o for o in DECLARED if o.dest == dest and o.flags), None)
    return own or _table()[dest]  # torchrun's parser is read only for torchrun's options


def launch_dests() -> tuple[str, ...]:
    """Every launch option ``numarun run`` takes: numarun's, then torchrun's."""
    return tuple(
        dict.fromkeys([*(o.dest for o in DECLARED if o.launch), *(d for d, o in _table().items() if o.launch)])
    )


class Spelled(argparse.Action):
    """Stores the value and the flag as typed (``--nodes`` for ``--nnodes``), so that a value refused later names
    the spelling the user wrote."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.spelled = {**getattr(namespace, "spelled", {}), self.dest: option_string or self.option_strings[0]}


def add_options(parser: argparse.ArgumentParser, dests: Iterable[str], *, group: Any = None) -> None:
    """Give ``parser`` (its argument ``group``) the flags of the options ``dests``, and ``--show-sources``.
    Flags torchrun's parser added already (``numarun run`` takes it as a parent) are taken over; the parser
    leaves out what was not typed, and hands the declarations on (``launch_options``) to :func:`from_args`."""
    present = {a.dest: a for a in parser._actions}  # noqa: SLF001  (argparse lists its actions nowhere else)
    options = tuple(option(d) for d in (*dests, *(() if "show_sources" in present else ("show_sources",))))
    for o in options:
        action = present.get(o.dest)
        if action is not None and o.owner != "numarun":
            action.default = argparse.SUPPRESS
            action.type = argtypes.typed(o.flag, o.read) if o.parse is not None else action.type
        else:
            o.add_to(parser if o.dest == "show_sources" else group or parser)
    parser.set_defaults(launch_options=(*(parser.get_default("launch_options") or ()), *options))


def resolve(*candidates: Setting | None) -> Setting:
    """The one precedence rule: the setting of the highest source (:class:`Source`); the first given of two from
    the same one."""
    return max((c for c in candidates if c is not None), key=lambda s: s.source)


def _text(value: Any) -> str:
    return (
        "(none)"
        if value is None
        else "''"
        if value == ""
        else str(value.value if isinstance(value, enum.Enum) else value)
    )


def _from(taken: Sequence[Option], typed: Mapping[str, Any], environ: Mapping[str, str]) -> LaunchOptions:
    settings = {}
    spelled = typed.get("spelled", {})
    for f in taken:
        text = environ.get(f.variable, "").strip() if f.variable else ""
        flag = spelled.get(f.dest, f.flag)
        value = f.read(typed[f.dest], flag) if f.dest in typed and f.read_late else typed.get(f.dest)
        settings[f.dest] = resolve(
            Setting(value, Source.COMMAND_LINE, flag) if f.dest in typed else None,
            Setting(f.read(text, f.variable), Source.ENVIRONMENT, f.variable) if text else None,
            Setting(f.default, Source.DEFAULT, f.owner),
        )
    return LaunchOptions.of(taken, settings)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> LaunchOptions:
    """The options of a command whose parser :func:`add_options` set up: the command line, the environment, the
    defaults."""
    return _from(vars(args).get("launch_options", ()), vars(args), environ)


def from_argv(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[LaunchOptions, list[str]]:
    """The options a ``numarun run`` command line states (its launch options and ``--log-level``; a sweep's jobs are
    handed theirs so), with the environment and the defaults; and the arguments that are none of them, as given."""
    parser = argparse.ArgumentParser(add_help=False, prog="numarun")
    add_options(parser, (*launch_dests(), "log_level"))

    def refuse(message: str) -> NoReturn:
        raise UsageError(f"bad launcher options {' '.join(argv)!r}: {message}; expected 'numarun run' options")

    parser.error = refuse  # type: ignore[method-assign]
    args, rest = parser.parse_known_args(list(argv))
    return from_args(args, environ), rest


def from_environ(dests: Iterable[str], environ: Mapping[str, str]) -> LaunchOptions:
    """Options where nothing was typed (a sweep's packed jobs): the environment, the defaults."""
    return _from([option(d) for d in dests], {}, environ)


def given(**values: Any) -> LaunchOptions:
    """Options a command decides itself (``numarun tune``'s winner), as if typed on its command line."""
    return LaunchOptions.of(
        (), {d: Setting(v, Source.COMMAND_LINE, "--" + d.replace("_", "-")) for d, v in values.items()}
    )
