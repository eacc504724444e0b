"""SLURM options as one frozen value, validated before anything is rendered or submitted. Pure.

Each check raises :class:`SlurmError` naming the bad value and the form sbatch accepts, so
``numarun submit --time 1:2:3:4`` exits 2 with one line and submits nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SlurmError, expected

TIME_FORM = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"
# sbatch --signal=[B:]SIG@TIME takes TIME in 0..65535 seconds.
MAX_SIGNAL_SECONDS = 0xFFFF
# Slurm stores a time limit in minutes as a 32-bit value (INFINITE is 0xffffffff); a year is
# far beyond any partition's MaxTime and keeps every value sbatch can parse.
MAX_TIME_SECONDS = 365 * 86400

_NAME = r"[A-Za-z0-9_.+-]{1,200}"
_TEXT_FIELDS = (  # (field, flag, pattern, form) of the header's free-text values, checked in this order
    (
        "gpus_per_node",
        "--gpus-per-node",
        r"(?:[A-Za-z0-9_.-]+:)?[0-9]{1,4}",
        "N or TYPE:N with N up to 9999, e.g. 4 or a100:4",
    ),
    (
        "partition",
        "--partition",
        r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*",
        "partition names of letters, digits and _.+- separated by commas",
    ),
    ("account", "--account", _NAME, "a name of letters, digits and _.+-"),
    ("qos", "--qos", _NAME, "a name of letters, digits and _.+-"),
    ("job_name", "--job-name", _NAME, "a name of letters, digits and _.+- (at most 200)"),
    # feature expressions: names joined by & | , with optional *count and [] () grouping
    (
        "constraint",
        "--constraint",
        r"[A-Za-z0-9_.+\-&|,*\[\]()!:]{1,1000}",
        "features joined by & | , with optional *N, [] and ()",
    ),
    # within Slurm's 64-bit count of MB
    ("mem", "--mem", r"(?i)[0-9]{1,12}[KMGT]?", "a size of up to 12 digits such as 4000, 16G or 512M"),
)
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The output dir sits in '#SBATCH --output=' lines, which sbatch reads without a shell:
# no whitespace, quotes or '%' (Slurm's filename patterns) there.
_PATH_BAD = re.compile(r"[\s'\"%\\]")


def parse_time(text: str) -> int | None:
    """A Slurm time limit in seconds; None for no limit (``UNLIMITED``, ``infinite``, ``0``)."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE") or t == "0":
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if not m or not t.isascii():
        raise SlurmError(expected(text, TIME_FORM, "--time"))
    days, a, b, c = m.groups()
    most: tuple[float, float, float]  # the largest hours, minutes and seconds of the form
    if days is not None:  # D-HH[:MM[:SS]]
        hms, most, rule = (int(a), int(b or 0), int(c or 0)), (23, 59, 59), "HH < 24, MM and SS < 60"
    elif c is not None:  # HH:MM:SS
        hms, most, rule = (int(a), int(b), int(c)), (math.inf, 59, 59), "MM and SS < 60"
    else:  # MM[:SS]
        hms, most, rule = (0, int(a), int(b or 0)), (math.inf, math.inf, 59), "SS < 60"
    if any(v > top for v, top in zip(hms, most)):
        raise SlurmError(expected(text, f"{TIME_FORM} ({rule})", "--time"))
    total = ((int(days or 0) * 24 + hms[0]) * 60 + hms[1]) * 60 + hms[2]
    if total <= 0:
        return None
    if total > MAX_TIME_SECONDS:
        raise SlurmError(expected(text, f"a limit up to {format_time(MAX_TIME_SECONDS)} (or UNLIMITED)", "--time"))
    return total


def format_time(seconds: int | None) -> str:
    """Seconds -> ``D-HH:MM:SS`` (or ``UNLIMITED``), the form sbatch prints back."""
    if seconds is None:
        return "UNLIMITED"
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def header_value(name: str) -> Callable[[str, str], str]:
    """The reader of the ``#SBATCH`` setting ``name`` as the command line gives it: the text as written, once
    :meth:`SlurmOptions.validate` takes it alone (a bad value is refused with the options, before a trainer job's
    config is composed)."""

    def read(text: str, where: str) -> str:
        setting: dict[str, Any] = {name: text}  # one field, by name: its type is the text the flag gave
        SlurmOptions(**setting).validate()
        return text

    return read


@dataclass(frozen=True)
class SlurmOptions:
    """What goes into the ``#SBATCH`` header, already validated (see :meth:`validate`)."""

    nodes: int = 1
    nproc_per_node: int | None = None
    """Ranks per node; None: numarun decides on the node (one per GPU, else 1)."""
    gpus_per_node: str | None = None
    """``N`` or ``TYPE:N``; None: ask for no GPUs."""
    partition: str | None = None
    time: str | None = None
    """As the user wrote it; checked by :func:`parse_time`."""
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    """True/False as asked; None: whole nodes unless a part was asked for (see :attr:`whole_nodes`)."""
    cpus_per_task: int | None = None
    """CPUs of the one task per node; None: the whole node (whole-node jobs) or Slurm's default."""
    node_gpus: int = 0
    """GPUs of each node of the partition, as found at submit time; a whole-node job asks for them all."""
    mem: str | None = None
    job_name: str = "numarun"
    requeue_limit: int = 3
    """How many times the job requeues itself after the pre-timeout signal."""
    signal_before: int | None = None
    """Seconds before the time limit at which Slurm signals the batch shell (USR1);
    None: 120, or a quarter of a shorter time limit."""
    extra_sbatch: tuple[str, ...] = field(default=())
    """Further ``--flag=value`` lines for the header, checked for newlines only."""

    def validate(self) -> SlurmOptions:
        """Raise SlurmError for the first bad value; return self so calls chain."""
        for flag, count in (
            ("--nnodes", self.nodes),
            ("--nproc-per-node", self.nproc_per_node),
            ("--cpus-per-task", self.cpus_per_task),
        ):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise SlurmError(expected(count, "an integer >= 1", flag))
        for name, flag, pattern, form in _TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None and not re.fullmatch(pattern, value):
                raise SlurmError(expected(value, form, flag))
        if not isinstance(self.requeue_limit, int) or self.requeue_limit < 0:
            raise SlurmError(expected(self.requeue_limit, "an integer >= 0", "--requeue-limit"))
        sig = self.signal_before
        if sig is not None and (
            isinstance(sig, bool) or not isinstance(sig, int) or not 1 <= sig <= MAX_SIGNAL_SECONDS
        ):
            raise SlurmError(expected(sig, f"seconds between 1 and {MAX_SIGNAL_SECONDS}", "--signal-before"))
        limit = self.time_limit_seconds
        if sig is not None and limit is not None and sig >= limit:
            raise SlurmError(
                expected(
                    self.signal_before,
                    f"fewer seconds than the time limit {self.time!r} ({limit} s)",
                    "--signal-before",
                )
            )
        for line in self.extra_sbatch:
            if not line.startswith("--") or any(c in line for c in "\n\r\0"):
                raise SlurmError(expected(line, "one sbatch option such as --mail-type=END", "extra sbatch option"))
        return self

    @property
    def whole_nodes(self) -> bool:
        """Whole nodes by default; a request for part of a node (or --no-exclusive) opts out."""
        if self.exclusive is not None:
            return self.exclusive
        return self.cpus_per_task is None and self.gpus_per_node is None

    @property
    def effective_gpus_per_node(self) -> str | None:
        """The GPUs asked for: the user's, else every GPU of a whole node, else none."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        if self.whole_nodes and self.node_gpus > 0:
            return str(self.node_gpus)
        return None

    def requested(self) -> str:
        """One line saying what each node of the job gets, for the script and --dry-run."""
        cpus = (
            "every CPU"
            if self.whole_nodes and self.cpus_per_task is None
            else (f"{self.cpus_per_task} CPUs" if self.cpus_per_task is not None else "Slurm's default CPUs (1)")
        )
        gpus = self.effective_gpus_per_node
        gpu_text = f"{gpus} GPUs" if gpus is not None else "no GPUs"
        if self.whole_nodes and self.gpus_per_node is None and self.node_gpus == 0:
            gpu_text += " (none found on the partition's nodes)"
        noun = "node" if self.nodes == 1 else "nodes"
        kind = f"{self.nodes} whole {noun} (--exclusive)" if self.whole_nodes else f"{self.nodes} {noun}, part of each"
        return f"{kind}: {cpus}, {gpu_text}"

    @property
    def time_limit_seconds(self) -> int | None:
        return None if self.time is None else parse_time(self.time)

    @property
    def effective_signal_before(self) -> int:
        """The ``@TIME`` of ``--signal``: the user's value, else 120 s (a quarter of a shorter limit)."""
        if self.signal_before is not None:
            return self.signal_before
        limit = self.time_limit_seconds
        return 120 if limit is None else max(1, min(120, limit // 4))


def check_env(pairs: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``KEY=VAL`` strings -> pairs; the value may hold anything (it is shell-quoted later)."""
    out = []
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.fullmatch(key):
            raise SlurmError(expected(item, "KEY=VALUE with KEY a shell variable name", "--env"))
        out.append((key, value))
    return tuple(out)


def check_output_dir(path: str) -> str:
    """The output root must be an absolute path sbatch can read in a header line."""
    if not path.startswith("/") or _PATH_BAD.search(path) or "\0" in path:
        raise SlurmError(
            expected(path, "an absolute path without whitespace, quotes, backslashes or '%'", "--output-dir")
        )
    return path.rstrip("/") or "/"
