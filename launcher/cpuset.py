"""CPU and node lists: ``"0-3,8"`` <-> sorted tuples, and kernel hex cpumasks. Pure."""

from __future__ import annotations

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
        if hi < lo or hi >= MAX_ID:
            raise CpuListError(expected(text, _LIST_FORM, what))
        if m.group(3) is not None:
            used, group = int(m.group(3)), int(m.group(4))
            if group == 0 or used == 0 or used > group:
                raise CpuListError(expected(text, _LIST_FORM, what))
            out.update(i for i in range(lo, hi + 1) if (i - lo) % group < used)
        else:
            out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def format_list(ids: Iterable[int], *, min_run: int = 2) -> str:
    """``{0,1,2,3,8}`` -> ``"0-3,8"`` (the kernel's cpulist form); runs shorter than ``min_run`` stay listed
    one by one (``min_run=3``: ``0,1,3`` for ranks)."""
    s = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts += [f"{s[i]}-{s[j]}"] if j - i + 1 >= max(min_run, 2) else [str(x) for x in s[i : j + 1]]
        i = j + 1
    return ",".join(parts)


def parse_mask(text: str, what: str = "cpu mask") -> tuple[int, ...]:
    """Parse a kernel hex cpumask such as ``"000000ff,ffff0000"`` (32-bit words, MSB first)."""
    t = text.strip().replace(",", "").lower()
    if t.startswith("0x"):
        t = t[2:]
    if not t:
        return ()
    if not re.fullmatch(r"[0-9a-f]+", t):
        raise CpuListError(expected(text, "a hex mask such as 'ff,00000000'", what))
    value = int(t, 16)
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)
