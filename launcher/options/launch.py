"""The launch options: each declared once (:data:`DECLARED`), built once per command with its value and source.

An option's one declaration holds its flags, its variable, its key in a job config's ``launcher`` group
(the schema's ``LauncherConfig`` is made from these), its default, how its text is read and its help.
torchrun's options are torch's own (its parser, read once per torch version:
:func:`~numarun.options.torchrun.torchrun_record`): a declaration that names no flags adopts one of them and adds
what numarun gives it (a job-config key, a scheduler's variable, a meaning in per-rank mode, a stricter check).

Every command takes its flags from here (:func:`add_options`); the parser keeps only what was typed, and
:func:`from_args` adds the environment and the defaults; :meth:`Options.with_config` a job config's ``launcher``
group and :meth:`Options.with_job` what the job numarun runs in fixes. The precedence (:func:`resolve`) is the
README's table ("Where each option comes from"). A new option is one entry of :data:`DECLARED` (``--on-hang``'s
below), read as ``options.on_hang``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import functools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import argtypes, envvars
from ..errors import UsageError
from . import choices as hangs
from .choices import BindingMode, MemPolicy, NicPolicy, parse_nproc

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
    """Where an option's value came from; a higher source wins ."""

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


@dataclass(frozen=True)
class Option:
    """One launch option, declared once."""

    dest: str
    flags: tuple[str, ...] = ()
    """Its spellings, the first ``--`` one named in messages; () adopts torchrun's option of that dest."""
    default: Any = None
    parse: Callable[[str], Any] | None = None
    """Text (a flag's, a variable's, a config value's) to value; raises with ``expected ...`` in its message."""
    help: str = ""
    metavar: str | None = None
    switch: bool = False
    env: str = ""
    """The variable that sets it; '' for ``NUMARUN_<DEST>`` (torchrun's: ``PET_<DEST>``, as torchrun reads them)."""
    config: type | None = None
    """The type of its key ``launcher.<dest>`` in a job config; None: no key."""
    job_env: str = ""
    """A scheduler's variable that sets it inside a job numarun found (``mpirun -x MASTER_ADDR``)."""
    per_rank: bool = False
    """Meaningful when the scheduler starts every rank itself (per-rank mode, no torchrun agent)."""
    planning: bool = False
    """An input of the plan: ``numarun plan``, the doctor and ``tune`` take it too."""
    default_text: str = ""
    """What the help says a None default means."""
    owner: str = "numarun"
    """Whose default it is: ``numarun`` or ``torch <version>``."""

    @property
    def flag(self) -> str:
        return next((s for s in self.flags if s.startswith("--")), self.flags[0] if self.flags else "--" + self.dest)

    @property
    def variable(self) -> str:
        return self.env or ("PET_" if self.owner != "numarun" else "NUMARUN_") + self.dest.upper()

    def read(self, raw: object, where: str) -> Any:
        """``raw`` (a variable's text, a config value) as the option's type; one line naming ``where`` if it is not
        one."""
        if self.switch:
            text = str(raw).strip()
            if not isinstance(raw, bool) and not text.lstrip("-").isdigit():  # torchrun's check_env: bool(int(...))
                raise UsageError(f"bad {where} {text!r}: expected 1 or 0")
            return raw if isinstance(raw, bool) else bool(int(text))
        if self.parse is None:
            return str(raw)
        try:
            return self.parse(str(raw))
        except (argparse.ArgumentTypeError, UsageError, TypeError, ValueError) as e:
            msg = str(e)
            kind = {int: "an integer", float: "a number"}.get(self.parse, f"a value {self.flag} takes")  # type: ignore[call-overload]
            expected = msg[msg.index("expected") :] if "expected" in msg else f"expected {kind}"
            raise UsageError(f"bad {where} {str(raw)!r}: {expected}") from None

    def argtype(self, text: str) -> Any:
        """:meth:`read` as argparse's ``type=``."""
        try:
            return self.read(text, self.flag)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    def help_text(self) -> str:
        shown = self.default_text or ("off" if self.switch and not self.default else _text(self.default))
        return f"{self.help} (default: ${self.variable}, else {shown})"


def _choices(kind: type[enum.Enum]) -> str:
    return ", ".join(m.value for m in kind)


DECLARED: tuple[Option, ...] = (
    Option(
        "topology",
        ("--topology",),
        env=envvars.TOPOLOGY,
        metavar="PATH",
        per_rank=True,
        planning=True,
        default_text="this machine",
        help="topology source: a machine root holding sys/ and proc/, a 'numarun topo --json' snapshot, "
        "hwloc XML, or saved 'nvidia-smi topo -m' text",
    ),
    Option(
        "nproc_per_node",
        ("--nproc-per-node", "--nproc_per_node"),
        env="PET_NPROC_PER_NODE",
        parse=parse_nproc,
        config=int,
        per_rank=True,
        planning=True,
        metavar="N",
        default_text="one per visible GPU, or 1 without GPUs",
        help="local ranks: a number, or torchrun's auto (one per GPU, else per CPU), gpu, cpu or xpu",
    ),
    Option("nnodes", config=int, per_rank=True),
    Option("node_rank", config=int, per_rank=True),
    Option(
        "binding",
        ("--binding", "--numa-binding", "--numa_binding"),
        default=BindingMode.EXCLUSIVE,
        parse=argtypes.choice(BindingMode, "--binding"),
        config=str,
        per_rank=True,
        planning=True,
        metavar="MODE",
        help=f"CPU binding: {_choices(BindingMode)}",
    ),
    Option(
        "mem_policy",
        ("--mem-policy",),
        default=MemPolicy.BIND,
        parse=argtypes.choice(MemPolicy, "--mem-policy"),
        config=str,
        per_rank=True,
        planning=True,
        metavar="POLICY",
        help=f"memory policy per rank: {_choices(MemPolicy)}",
    ),
    Option(
        "nic_policy",
        ("--nic-policy",),
        default=NicPolicy.NODE,
        parse=argtypes.choice(NicPolicy, "--nic-policy"),
        config=str,
        per_rank=True,
        planning=True,
        metavar="POLICY",
        help="NCCL_IB_HCA/NCCL_SOCKET_IFNAME: 'node' = one list of the node's compute NICs for every rank; "
        "'per-rank' = each rank's closest NIC only",
    ),
    # read by numarun.layout.parse_mesh where the plan is made, so that a bad value names its source
    Option(
        "mesh",
        ("--mesh",),
        config=str,
        per_rank=True,
        planning=True,
        metavar="SPEC",
        default_text="none",
        help="parallel layout, outermost first, e.g. pp=2,dp_shard=-1,tp=4 (names pp, dp_replicate, dp_shard, cp, "
        "tp; -1: the rest): each local rank drives the GPU that puts tp's groups on the fastest links, then cp's, "
        "dp_shard's and dp_replicate's (docs/layouts.md)",
    ),
    Option("master_addr", config=str, per_rank=True, job_env="MASTER_ADDR"),
    Option("master_port", parse=argtypes.port("--master-port"), config=int, per_rank=True, job_env="MASTER_PORT"),
    Option("rdzv_backend"),
    Option("rdzv_endpoint", config=str),
    Option("rdzv_id", config=str),
    Option("standalone", per_rank=True),
    Option(
        "strict_binding",
        ("--strict-binding",),
        default=False,
        switch=True,
        config=bool,
        per_rank=True,
        help=(
            f"a rank whose binding cannot be applied fails instead of running unbound (sets {envvars.STRICT_BINDING}=1)"
        ),
    ),
    Option(
        "hang_timeout",
        ("--hang-timeout",),
        default=hangs.DEFAULT_TIMEOUT_S,
        parse=hangs.parse_hang_timeout,
        config=float,
        metavar="SECONDS",
        help="print the roll-call of every rank when no rank entered or left a torch.distributed collective or "
        "took an optimizer step for this long while a rank's stack stood still (0: off)",
    ),
    Option(
        "on_hang",
        ("--on-hang",),
        default=hangs.OnHang.REPORT,
        parse=argtypes.choice(hangs.OnHang, "--on-hang"),
        config=str,
        metavar="ACTION",
        help=f"after the roll-call: report (keep running) or stop (end the job, exit code {hangs.EXIT_HANG})",
    ),
)
"""numarun's launch options, and the torchrun options numarun gives more (no flags: torchrun's own), in the order
``--show-sources`` lists them."""

PLANNING = tuple(o.dest for o in DECLARED if o.planning)


def config_keys() -> tuple[tuple[str, type], ...]:
    """(key, type) of each option a job config's ``launcher`` group may set."""
    return tuple((o.dest, o.config) for o in DECLARED if o.config is not None)


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Option]:
    """Every launch option by dest: torchrun's (as its parser declares them), each adopted one with numarun's
    additions, then numarun's own."""
    from .torchrun import torch_owner as owner
    from .torchrun import torchrun_record

    declared = {o.dest: o for o in DECLARED}
    claimed = {f for o in DECLARED for f in o.flags}  # torchrun's --numa-binding is numarun's --binding
    table: dict[str, Option] = {}
    for r in torchrun_record():
        if not r["flags"] or r["dest"] in NOT_LAUNCH or (r["dest"] not in declared and claimed & set(r["flags"])):
            continue
        kind = {"int": int, "float": float}.get(r["type"] or "")
        default = kind(r["default"]) if kind and isinstance(r["default"], str) else r["default"]  # as argparse does
        torch = Option(
            r["dest"], tuple(r["flags"]), default, kind, r["help"] or "", r["metavar"], r["nargs"] == 0, owner=owner()
        )
        own = declared.get(r["dest"])
        if own is not None and not own.flags:  # adopted: torchrun's flags and default, numarun's additions
            torch = dataclasses.replace(
                own,
                flags=torch.flags,
                default=torch.default,
                parse=own.parse or kind,
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
    return tuple(dict.fromkeys([*(o.dest for o in DECLARED), *_table()]))


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
        spelled = {**getattr(namespace, "spelled", {}), self.dest: option_string or self.option_strings[0]}
        namespace.spelled = spelled


def add_options(parser: argparse.ArgumentParser, dests: Iterable[str], *, group: Any = None) -> None:
    """Give ``parser`` (its argument ``group``) the flags of the launch options ``dests``, and ``--show-sources``.
    Flags torchrun's parser added already (``numarun run`` takes it as a parent) are taken over; the parser
    leaves out what was not typed, and hands the declarations on (``launch_options``) to :func:`from_args`."""
    where = group or parser
    present = {a.dest: a for a in parser._actions}  # noqa: SLF001  (argparse lists its actions nowhere else)
    options = tuple(option(d) for d in dests)
    for o in options:
        action = present.get(o.dest)
        if action is not None and o.owner != "numarun":
            action.default = argparse.SUPPRESS
            action.type = o.argtype if o.parse is not None else action.type
        elif o.switch:
            where.add_argument(
                *o.flags,
                dest=o.dest,
                action="store_true",
                default=argparse.SUPPRESS,
                help=o.help_text() if o.owner == "numarun" else o.help,
            )
        else:
            where.add_argument(
                *o.flags,
                dest=o.dest,
                type=o.argtype,
                default=argparse.SUPPRESS,
                metavar=o.metavar,
                action=Spelled,
                help=o.help_text() if o.owner == "numarun" else o.help,
            )
    if "show_sources" not in present:
        parser.add_argument(
            "--show-sources",
            action="store_true",
            help="also print each launch option with its value and source (on stderr)",
        )
    parser.set_defaults(launch_options=(*(parser.get_default("launch_options") or ()), *options))


def resolve(*candidates: Setting | None) -> Setting:
    """The one precedence rule: the setting of the highest source (:class:`~numarun.jobenv.settle.Source`); the
    first given of two from the same one."""
    return max((c for c in candidates if c is not None), key=lambda s: s.source)


@dataclass(frozen=True)
class Options:
    """Every launch option of a command, as a :class:`~numarun.jobenv.settle.Setting`; ``options.binding``
    is the value, :meth:`setting` the value with its source."""

    fields: tuple[Option, ...]
    settings: Mapping[str, Setting]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("fields", "settings"):
            raise AttributeError(name)
        try:
            return self.settings[name].value
        except KeyError:
            raise AttributeError(name) from None

    def setting(self, dest: str) -> Setting:
        return self.settings[dest]

    def stated(self) -> dict[str, Setting]:
        """The settings a source other than the default gave."""
        return {d: s for d, s in self.settings.items() if s.source > Source.DEFAULT and s.value is not None}

    def values(self) -> dict[str, Any]:
        """dest -> value of :meth:`stated` (torchrun applies its own defaults to the rest)."""
        return {d: s.value for d, s in self.stated().items()}

    def _with(self, settings: Iterable[tuple[str, Setting]], *, newer_wins: bool) -> Options:
        """With ``settings`` in their place in the precedence; from the same source, the newer or the older wins."""
        merged = dict(self.settings)
        for dest, s in settings:
            merged[dest] = (
                (resolve(s, merged[dest]) if newer_wins else resolve(merged[dest], s)) if dest in merged else s
            )
        return dataclasses.replace(self, settings=merged)

    def flags(self, *sources: Source, leave_out: Iterable[str] = ()) -> list[str]:
        """``--flag=value`` (a switch: ``--flag``) of each option a source of ``sources`` stated, for a ``numarun run``
        this command starts (what the environment gave reaches it by itself)."""
        out = []
        for dest, s in self.stated().items():
            if s.source in sources and dest not in leave_out:
                o = option(dest)
                out += ([o.flag] if s.value else []) if o.switch else [f"{o.flag}={_text(s.value)}"]
        return out

    def with_config(self, launcher: Mapping[str, Any], prefix: str = "launcher") -> Options:
        """With a job config's ``launcher`` group (None: not set there) in its place in the precedence;
        ``prefix``: where the values are (``hydra.launcher`` for a sweep launcher's own)."""
        given = [
            (f.dest, Setting(f.read(value, f"{prefix}.{f.dest}"), Source.CONFIG, f"{prefix}.{f.dest}"))
            for f in self.fields
            if f.config is not None and (value := launcher.get(f.dest)) is not None
        ]
        return self._with(given, newer_wins=True)

    def with_job_env(self, environ: Mapping[str, str]) -> Options:
        """Inside a job numarun found: the scheduler's variables its options read (``MASTER_ADDR``, ``MASTER_PORT``),
        below numarun's and torchrun's own (``PET_MASTER_ADDR``)."""
        given = [
            (f.dest, Setting(f.read(text, f.job_env), Source.ENVIRONMENT, f.job_env))
            for f in self.fields
            if f.job_env and (text := environ.get(f.job_env, "").strip())
        ]
        return self._with(given, newer_wins=False)

    def with_job(self, values: Mapping[str, Any], job: str) -> Options:
        """With what the job fixes: a stated value that agrees keeps its source (one that contradicts the job
        was refused before, by :mod:`numarun.jobenv.settle`; here it can only change form, ``1:4`` to ``2``)."""
        settings = dict(self.settings)
        for dest, value in values.items():
            if dest in settings and (settings[dest].source is Source.DEFAULT or settings[dest].value != value):
                settings[dest] = Setting(value, Source.JOB, job)
        return dataclasses.replace(self, settings=settings)

    def with_defaults(self, owner: str, **values: Any) -> Options:
        """A command's own defaults in place of the declared ones (``numarun bench`` runs 2 ranks)."""
        return dataclasses.replace(
            self,
            settings={
                **self.settings,
                **{
                    d: Setting(v, Source.DEFAULT, owner)
                    for d, v in values.items()
                    if self.settings[d].source is Source.DEFAULT
                },
            },
        )

    def describe(self) -> str:
        """``# options`` and a line per declared option and per stated one, e.g.
        ``#   binding          node             job config (launcher.binding)``."""
        order = [o.dest for o in DECLARED]
        rows = sorted(
            ((d, s) for d, s in self.settings.items() if d in order or s.source > Source.DEFAULT),
            key=lambda r: order.index(r[0]) if r[0] in order else len(order),
        )
        return "# options (value, source):\n" + "".join(
            f"#   {d:<16} {_text(s.value):<16} {s.source} ({s.where})\n" for d, s in rows
        )


def _text(value: Any) -> str:
    return (
        "(none)"
        if value is None
        else "''"
        if value == ""
        else str(value.value if isinstance(value, enum.Enum) else value)
    )


def _from(fields: Sequence[Option], typed: Mapping[str, Any], environ: Mapping[str, str]) -> Options:
    settings = {}
    spelled = typed.get("spelled", {})
    for f in fields:
        text = environ.get(f.variable, "").strip()
        settings[f.dest] = resolve(
            Setting(typed[f.dest], Source.COMMAND_LINE, spelled.get(f.dest, f.flag)) if f.dest in typed else None,
            Setting(f.read(text, f.variable), Source.ENVIRONMENT, f.variable) if text else None,
            Setting(f.default, Source.DEFAULT, f.owner),
        )
    return Options(tuple(fields), settings)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Options:
    """The options of a command whose parser :func:`add_options` set up: the command line, the environment, the
    defaults."""
    return _from(vars(args)["launch_options"], vars(args), environ)


def from_environ(dests: Iterable[str], environ: Mapping[str, str]) -> Options:
    """Options where nothing was typed (a sweep's packed jobs): the environment, the defaults."""
    return _from([option(d) for d in dests], {}, environ)


def given(**values: Any) -> Options:
    """Options a command decides itself (``numarun tune``'s winner), as if typed on its command line."""
    return Options((), {d: Setting(v, Source.COMMAND_LINE, "--" + d.replace("_", "-")) for d, v in values.items()})


def shown(args: argparse.Namespace, options: Options, *, title: str = "") -> Options:
    """``--show-sources``: the options block on stderr (``title`` first); returns ``options``."""
    if getattr(args, "show_sources", False):
        sys.stderr.write(title + options.describe())
    return options
