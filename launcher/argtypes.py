"""Number and address options of every command: bounded whole numbers, finite floats, host:port; and the JSON
output options (:func:`add_json_options`).

A number option feeds something with a range of its own: a rank count becomes a list of
bindings and a process each, a node count a 32-bit world size in c10d's store, a port a
16-bit field, seconds a timer. A value outside that range is refused here, as one line
naming the flag, the value and the range (argparse then exits 2), before any process starts.
``nan`` and ``inf`` are never a number of seconds or a fraction.
"""

from __future__ import annotations

import argparse
import enum
import functools
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from .errors import NumarunError, UsageError

MAX_LOCAL_RANKS = 8192
"""Ranks per node: Linux's largest NR_CPUS (one rank per CPU of the largest machine it builds for)."""
MAX_NODES = 131072
"""Nodes of a job: with :data:`MAX_LOCAL_RANKS` a world size of 2**30, within c10d's 32-bit ranks."""
MAX_PORT = 65535
MAX_SECONDS = 30 * 86400
"""Timeouts and intervals: 30 days (far past any job; timers overflow long before 1e20 s)."""
MAX_COUNT = 1_000_000
"""Iterations, trials, restarts."""

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")

_WHOLE = re.compile(r"\s*[+-]?[0-9]{1,30}\s*")
_DECIMAL = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")
"""A number of seconds or a fraction as people type one (``float()`` also reads ``1_000``, ``٣٠`` and ``２``)."""


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a whole number as people type one, ASCII digits only. ``str.isdigit()`` is also true for
    characters ``int()`` refuses (superscripts: ``'²'``: a traceback after the check) and for other scripts' digits
    (``'٢'``, ``'２'``, which ``int()`` reads: a layout ``--mesh`` refuses would pass elsewhere)."""
    return text.isascii() and text.isdigit()


Reader = Callable[[str, str], T]
"""How an option's text is read: (the text, where it came from: a flag, a variable, a config key) -> the value; a
one-line :class:`UsageError` naming where and the expected form otherwise. The same reader serves a flag, a
variable and a config value, so its error names the source itself."""


def check_int(text: object, flag: str, *, low: int, high: int) -> int:
    """``text`` as a whole number from ``low`` to ``high``; UsageError (one line) otherwise."""
    s = str(text)
    if not _WHOLE.fullmatch(s) or not low <= int(s) <= high:
        raise UsageError(f"bad {flag} {s.strip()!r}: expected a whole number from {low} to {high}")
    return int(s)


@dataclass(frozen=True)
class NodeRange:
    """torchrun's ``--nnodes``, read once (:func:`node_range`): from ``min`` to ``max`` nodes; a fixed count when they
    are equal, elastic otherwise (the world size comes with the rendezvous)."""

    min: int
    max: int
    text: str = field(default="", compare=False)
    """As it was written (``2``, ``2:2``, torchrun's default ``1:1``), for torchrun's argv and for messages; ''
    for the shortest form."""

    @property
    def elastic(self) -> bool:
        return self.min != self.max

    def __contains__(self, nodes: int) -> bool:
        return self.min <= nodes <= self.max

    def __str__(self) -> str:
        """The text torchrun reads: ``N`` or ``MIN:MAX``."""
        return self.text or (f"{self.min}:{self.max}" if self.elastic else str(self.min))

    @classmethod
    def of(cls, nodes: int) -> NodeRange:
        """A fixed count of ``nodes``."""
        return cls(nodes, nodes)


ONE_NODE = NodeRange.of(1)
"""torchrun's default ``--nnodes``."""


def node_range(text: str, where: str) -> NodeRange:
    """The reader of torchrun's ``--nnodes``: ``N`` or ``MIN:MAX``; UsageError (one line) otherwise."""
    parts = text.split(":")
    if (
        len(parts) <= 2
        and all(_WHOLE.fullmatch(p) for p in parts)
        and 1 <= int(parts[0]) <= int(parts[-1]) <= MAX_NODES
    ):
        return NodeRange(int(parts[0]), int(parts[-1]), text.strip())
    raise UsageError(f"bad {where} {text!r}: expected N or MIN:MAX with 1 <= MIN <= MAX <= {MAX_NODES}, e.g. 2 or 1:4")


def check_float(text: object, flag: str, *, low: float, high: float, above: bool = False, unit: str = "") -> float:
    """``text`` as a finite number in [low, high] (``above``: low excluded); UsageError otherwise."""
    s = str(text).strip()
    value = float(s) if _DECIMAL.fullmatch(s) else math.nan
    if not math.isfinite(value) or not (value > low if above else value >= low) or value > high:
        rel = ">" if above else ">="
        raise UsageError(f"bad {flag} {s!r}: expected a finite number{unit} {rel} {low:.10g} and <= {high:.10g}")
    return value


def whole(*, low: int, high: int) -> Reader[int]:
    """The reader of a whole number from ``low`` to ``high`` (:func:`check_int`)."""
    return functools.partial(check_int, low=low, high=high)


def finite(*, low: float, high: float, above: bool = False, unit: str = "") -> Reader[float]:
    """The reader of a finite number in [low, high] (:func:`check_float`)."""
    return functools.partial(check_float, low=low, high=high, above=above, unit=unit)


def duration(*, low: float = 0.0, above: bool = True) -> Reader[float]:
    """The reader of a number of seconds above ``low`` (``above`` False: from ``low``), up to :data:`MAX_SECONDS`."""
    return finite(low=low, high=MAX_SECONDS, above=above, unit=" of seconds")


PORT = whole(low=1, high=MAX_PORT)
"""The reader of a port number."""


def converted(kind: Callable[[str], T], what: str) -> Reader[T]:
    """The reader of what ``kind(text)`` makes; a ValueError refuses the text, expecting ``what``."""

    def read(text: str, where: str) -> T:
        try:
            return kind(text)
        except ValueError:
            raise UsageError(f"bad {where} {text!r}: expected {what}") from None

    return read


def member(kind: type[E]) -> Reader[E]:
    """The reader of a ``str`` Enum: a member by its value."""
    return converted(kind, f"one of {', '.join(str(m.value) for m in kind)}")


def typed(flag: str, read: Reader[T]) -> Callable[[str], T]:
    """An argparse ``type=`` for ``flag`` that reads its text with ``read``."""

    def parse(text: str) -> T:
        try:
            return read(text, flag)
        except NumarunError as e:  # a reader's error is about the text it read
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def int_in(flag: str, *, low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type=`` for :func:`check_int`."""
    return typed(flag, whole(low=low, high=high))


def parse_endpoint(text: object, flag: str, *, port: bool | None = None) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]:port``, ``[v6]`` or a bare IPv6 address (no port) -> (host, port or None);
    ``port`` True requires one, False refuses one. Anything else: a one-line :class:`UsageError`."""
    s = str(text).strip()
    form = (
        f"HOST:PORT (IPv6: [ADDR]:PORT) with PORT from 1 to {MAX_PORT}, e.g. node0:29500"
        if port
        else "a host name or address without a port (IPv6 bare or in brackets), e.g. node0 or fe80::1"
        if port is False
        else "HOST or HOST:PORT (IPv6: [ADDR]:PORT, or a bare ADDR without one) "
        f"with PORT from 1 to {MAX_PORT}, e.g. node0:29500"
    )
    if s.startswith("["):
        host, close, rest = s[1:].partition("]")
        good = bool(close) and rest[:1] in ("", ":") and ":" in host and ip_address(host) is not None
        sep, digits = rest[:1], rest[1:]
    else:
        host, sep, digits = s.partition(":") if s.count(":") == 1 else (s, "", "")
        good = ":" not in host or ip_address(host) is not None  # a colon: IPv6
    if (
        not good
        or not host
        or any(c.isspace() or c in "[]/" for c in host)
        or (port and not sep)
        or (sep and port is False)
    ):
        raise UsageError(f"bad {flag} {s!r}: expected {form}")
    if not sep:
        return host, None
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 5 and 1 <= int(digits) <= MAX_PORT):
        raise UsageError(f"bad {flag} {s!r}: port {digits!r} is not a number from 1 to {MAX_PORT}; expected {form}")
    return host, int(digits)


def ip_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address (a zone such as ``%eth0`` ignored); None for a name."""
    try:
        return ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None


def host_port(host: str, port: int | None = None) -> str:
    """``host:port`` with an IPv6 address in brackets (``[::1]:29500``); ``host`` alone (bracketed) without a port."""
    h = f"[{host}]" if ":" in host else host
    return h if port is None else f"{h}:{port}"


def seconds(flag: str, *, low: float = 0.0, above: bool = True) -> Callable[[str], float]:
    return typed(flag, duration(low=low, above=above))


# ---------------------------------------------------------------- JSON output


def json_moved(value: str) -> str:
    """The line for a file given to ``--json``, which once took one."""
    return (
        f"bad --json {value!r}: --json prints JSON on standard output and takes no file; expected --json-file {value}"
    )


class _PrintJson(argparse.Action):
    """``--json``: a switch. A value given to it (``--json FILE``, ``--json=FILE``: the old spellings) is refused in
    one line naming ``--json-file``, never taken for something else."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        if values is not None and values != []:
            raise argparse.ArgumentError(self, json_moved(str(values)))
        setattr(namespace, self.dest, True)


_IGNORED = re.compile(r"argument --json: ignored explicit argument (['\"])(.*)\1")


def add_json_options(parser: argparse.ArgumentParser, *, what: str, script_follows: bool = False) -> None:
    """``--json`` (print ``what`` as JSON on standard output instead of the table, as every command's ``--json``
    does) and ``--json-file FILE`` (write it to FILE as well). ``script_follows``: the command's last positional is
    a script, which ``--json`` must not take for its value: ``--json FILE SCRIPT`` then reads FILE as the script
    (the command refuses a script named ``*.json`` with :func:`json_moved`), and ``--json=FILE`` is argparse's
    error about a switch given a value, reworded here."""
    parser.add_argument(
        "--json",
        action=_PrintJson,
        nargs=0 if script_follows else "?",
        default=False,
        help=f"print {what} as JSON on standard output, instead of the table",
    )
    parser.add_argument("--json-file", metavar="FILE", default=None, help=f"also write {what} as JSON to FILE")
    if script_follows:
        error: Callable[[str], NoReturn] = parser.error

        def refuse(message: str) -> NoReturn:
            m = _IGNORED.fullmatch(message)
            error(f"argument --json: {json_moved(m.group(2))}" if m else message)

        parser.error = refuse  # type: ignore[method-assign]


def add_job_pid(parser: argparse.ArgumentParser) -> None:
    """``--pid PID``: the running numarun job a command looks at (``numarun stacks``, ``numarun top``)."""
    parser.add_argument(
        "--pid",
        type=int_in("--pid", low=1, high=2**22),
        default=None,
        metavar="PID",
        help="the job: its numarun's pid or one of its ranks' (default: the latest started of yours here)",
    )
