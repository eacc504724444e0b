"""The launch options of one command, built once: every field with its value and its source.

The command's parser keeps only what was typed (:func:`track` takes the launch options' defaults
out of it); :func:`from_args` adds the environment and the defaults, :meth:`Options.with_config` a
job config's ``launcher`` group, and :meth:`Options.with_job` what the job numarun runs in fixes.
The precedence (:func:`resolve`) is the README's table ("Where each option comes from").
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..jobenv.settle import Setting, Source

NUMARUN_OWN = ("topology", "binding", "mem_policy", "nic_policy", "strict_binding", "mesh", "hang_timeout",
               "on_hang")
"""numarun's own launch options, read from ``NUMARUN_<NAME>``; the others from ``PET_<NAME>``, as torchrun reads them."""
PLAN_FIELDS = ("topology", "nproc_per_node", "binding", "mem_policy", "nic_policy", "mesh")
NOT_LAUNCH = ("help", "module", "no_python", "run_path", "virtual_local_rank", "training_script", "training_script_args")
"""torchrun's options that choose the program, not the launch."""
SHOWN = ("topology", "nproc_per_node", "nnodes", "node_rank", "binding", "mem_policy", "nic_policy", "master_addr",
         "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "standalone", "strict_binding", "hang_timeout", "on_hang")
"""Listed by :meth:`Options.describe` even at their default."""


@dataclass(frozen=True)
class Field:
    """One launch option: its flag, its variable, its default and whose default that is."""

    dest: str
    flag: str
    env: str
    default: Any
    owner: str
    """``numarun`` or ``torch <version>``."""
    convert: Callable[[str], Any] | None = None
    switch: bool = False

    def read(self, raw: object, where: str) -> Any:
        """``raw`` (a variable's text, a config value) as the option's type; one line naming ``where`` if it is not one."""
        if self.switch:
            text = str(raw).strip()
            if not isinstance(raw, bool) and not text.lstrip("-").isdigit():  # torchrun's check_env: bool(int(...))
                raise UsageError(f"bad {where} {text!r}: expected 1 or 0")
            return raw if isinstance(raw, bool) else bool(int(text))
        if self.convert is None:
            return str(raw)
        try:
            return self.convert(str(raw))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
            msg = str(e)
            expected = msg[msg.index("expected"):] if "expected" in msg else f"expected a value {self.flag} takes"
            raise UsageError(f"bad {where} {str(raw)!r}: {expected}") from None


def track(parser: argparse.ArgumentParser, dests: Collection[str], *, torch: str = "") -> None:
    """Make ``parser`` leave the launch options ``dests`` out of its result unless typed; their
    defaults go into the field table it hands on (``launch_fields``). ``torch``: the owner of the
    other defaults, ``torch <version>`` for torchrun's parser, else numarun."""
    fields = []
    for a in parser._actions:  # noqa: SLF001  (argparse lists its actions nowhere else)
        if a.dest not in dests or not a.option_strings:
            continue
        default = a.type(a.default) if isinstance(a.default, str) and callable(a.type) else a.default  # as argparse does
        owner = "numarun" if a.dest in (*NUMARUN_OWN, *PLAN_FIELDS) or not torch else torch
        env = ("NUMARUN_" if a.dest in NUMARUN_OWN else "PET_") + a.dest.upper()
        flag = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
        fields.append(Field(a.dest, flag, env, default, owner, a.type if callable(a.type) else None, a.nargs == 0))
        a.default = argparse.SUPPRESS
    parser.set_defaults(launch_fields=tuple(fields))


def resolve(*candidates: Setting | None) -> Setting:
    """The one precedence rule: the setting of the highest source (:class:`~numarun.jobenv.settle.Source`)."""
    return max((c for c in candidates if c is not None), key=lambda s: s.source)


@dataclass(frozen=True)
class Options:
    """Every launch option of a command, as a :class:`~numarun.jobenv.settle.Setting`; ``options.binding``
    is the value, :meth:`setting` the value with its source."""

    fields: tuple[Field, ...]
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

    def with_config(self, launcher: Mapping[str, Any]) -> Options:
        """With a job config's ``launcher`` group (None: not set there) in its place in the precedence."""
        settings = dict(self.settings)
        for f in self.fields:
            value = launcher.get(f.dest)
            if value is not None:
                where = f"launcher.{f.dest}"
                settings[f.dest] = resolve(settings[f.dest], Setting(f.read(value, where), Source.CONFIG, where))
        return dataclasses.replace(self, settings=settings)

    def with_job(self, values: Mapping[str, Any], job: str) -> Options:
        """With what the job fixes: a stated value that agrees keeps its source (one that contradicts the job
        was refused before, by :mod:`numarun.jobenv.settle`; here it can only change form, ``1:4`` to ``2``)."""
        settings = dict(self.settings)
        for dest, value in values.items():
            if dest in settings and (settings[dest].source is Source.DEFAULT or settings[dest].value != value):
                settings[dest] = Setting(value, Source.JOB, job)
        return dataclasses.replace(self, settings=settings)

    def applied(self, args: argparse.Namespace) -> argparse.Namespace:
        """A copy of ``args`` holding every option's value, for code that reads a namespace."""
        out = copy.copy(args)
        for dest, s in self.settings.items():
            setattr(out, dest, s.value)
        return out

    def describe(self) -> str:
        """``# options`` and a line per option of :data:`SHOWN` and per stated one, e.g.
        ``#   binding          node             job config (launcher.binding)``."""
        rows = sorted(((d, s) for d, s in self.settings.items() if d in SHOWN or s.source > Source.DEFAULT),
                      key=lambda r: SHOWN.index(r[0]) if r[0] in SHOWN else len(SHOWN))
        return "# options (value, source):\n" + "".join(f"#   {d:<16} {_text(s.value):<16} {s.source} ({s.where})\n"
                                                         for d, s in rows)


def _text(value: Any) -> str:
    return "(none)" if value is None else "''" if value == "" else str(value.value if isinstance(value, enum.Enum) else value)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Options:
    """The options of a command whose parser :func:`track` set up: the command line, the environment, the defaults."""
    typed = vars(args)
    fields: Iterable[Field] = typed["launch_fields"]
    settings = {}
    for f in fields:
        text = environ.get(f.env, "").strip()
        settings[f.dest] = resolve(
            Setting(typed[f.dest], Source.COMMAND_LINE, f.flag) if f.dest in typed else None,
            Setting(f.read(text, f.env), Source.ENVIRONMENT, f.env) if text else None,
            Setting(f.default, Source.DEFAULT, f.owner),
        )
    return Options(tuple(fields), settings)


def given(**values: Any) -> Options:
    """Options a command decides itself (``numarun tune``'s winner), as if typed on its command line."""
    return Options((), {d: Setting(v, Source.COMMAND_LINE, "--" + d.replace("_", "-")) for d, v in values.items()})
