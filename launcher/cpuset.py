"""CPU and node lists: ``"0-3,8"`` <-> sorted tuples, and kernel hex cpumasks. Pure."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from .errors import CpuListError, expected

MAX_ID = 1 << 16  # Linux's NR_CPUS tops out at 8192 (MAXSMP), node ids at 1024: above is garbage

_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")
_LIST_FORM = "a list such as '0-3,8,10-11' (ascending ranges of non-negative integers)"


def parse_list(text: str, what: str = "cpu list") -> tuple[int, ...]:
    """Parse a kernel cpulist: ``""``, ``"0-3,8"``, or ``bitmap_parselist``'s ``a-b:used/group``; CpuListError
    otherwise."""
    text = text.strip()
    if not text:
        return ()
    out: set[int] = set()
    for item in text.split(","):
        m = _ITEM.match(item.strip())
        if not m:
            raise CpuListError(expected(text, _LIST_FORM, what))
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        used, group = (int(m.group(3)), int(m.group(4))) if m.group(3) is not None else (1, 1)
        if hi < lo or hi >= MAX_ID or group == 0 or used == 0 or used > group:
            raise CpuListError(expected(text, _LIST_FORM, what))
        out.update(i for i in range(lo, hi + 1) if (i - lo) % group < used)
    return tuple(sorted(out))


def format_list(ids: Iterable[int], *, min_run: int = 2) -> str:
    """``{0,1,2,3,8}`` -> ``"0-3,8"`` (the kernel's cpulist form); runs shorter than ``min_run`` stay listed
    one by one (``min_run=3``: ``0,1,3`` for ranks)."""
    parts: list[str] = []
    for lo, hi in runs(ids):
        parts += [f"{lo}-{hi}"] if hi - lo + 1 >= max(min_run, 2) else [str(x) for x in range(lo, hi + 1)]
    return ",".join(parts)


def runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """The runs of consecutive ids, ascending: ``{0,1,2,3,8}`` -> ``[(0, 3), (8, 8)]``."""
    out: list[tuple[int, int]] = []
    for _, run in itertools.groupby(enumerate(sorted(set(ids))), lambda pos_id: pos_id[1] - pos_id[0]):
        members = [i for _, i in run]
        out.append((members[0], members[-1]))
    return out


def parse_mask(text: str, what: str = "cpu mask") -> tuple[int, ...]:
    """Parse a kernel hex cpumask such as ``"000000ff,ffff0000"`` (32-bit words, MSB first)."""
    t = text.strip().replace(",", "").lower()
    if t.startswith("0x"):
        t = t[2:]
    if not t:
        return ()
    if not re.fullmatch(r"[0-9a-f]+", t):
        raise CpuListError(expected(text, "a hex mask such as 'ff,00000000'", what))
    return bits(int(t, 16))


def bits(value: int) -> tuple[int, ...]:
    """The positions of the set bits of ``value``, ascending: ``0b101`` -> ``(0, 2)``."""
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)
