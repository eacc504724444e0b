"""Slurm hostlist expressions (``node[01-03,07]``, ``a[1-2]b[3-4]``) -> host names, by ``scontrol show hostnames``'
rules, so that every task finds the node order without asking slurmctld (pure)."""

from __future__ import annotations

import itertools
import math
import re

from ..errors import SlurmError, expected

FORM = "a Slurm hostlist such as 'node[01-03,07]' or 'a[1-2]b[3-4],login1'"
MAX_HOSTS = 1_000_000  # '[1-99999999]' would otherwise allocate without bound
# an item: a host or a pattern, no space, no comma outside its brackets, brackets closed and never nested
_ITEM = r"[^,\[\]\s]*(?:\[[^\[\]\s]*\][^,\[\]\s]*)*"
_LIST = re.compile(rf"(?=[^,])(?:{_ITEM})(?:,(?=[^,]){_ITEM})*")  # items, none empty
_ITEMS = re.compile(rf"(?:^|,)({_ITEM})")
_RANGES = re.compile(r"\[([^\]]*)\]")


def _expand_range(body: str, original: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        lo, sep, hi = piece.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            raise SlurmError(expected(original, FORM, "hostlist"))
        if not sep:
            out.append(lo)
            continue
        start, stop = int(lo), int(hi)
        if stop < start or stop - start >= MAX_HOSTS:
            raise SlurmError(expected(original, FORM + " (ranges go low-high)", "hostlist"))
        width = len(lo)
        out.extend(str(i).zfill(width) for i in range(start, stop + 1))
    return out


def _expand_item(item: str, original: str) -> list[str]:
    parts = _RANGES.split(item)  # text, range, text, range, ..., text
    segments = [_expand_range(p, original) if i % 2 else [p] for i, p in enumerate(parts)]
    if math.prod(len(seg) for seg in segments) > MAX_HOSTS:
        raise SlurmError(expected(original, f"at most {MAX_HOSTS} hosts", "hostlist"))
    return ["".join(combo) for combo in itertools.product(*segments)]


def expand_hostlist(text: str) -> list[str]:
    """All host names of a hostlist, in order, duplicates kept (as ``scontrol show hostnames``)."""
    stripped = text.strip()
    if not _LIST.fullmatch(stripped):
        raise SlurmError(expected(text, FORM, "hostlist"))
    hosts: list[str] = []
    for item in _ITEMS.findall(stripped):
        hosts.extend(_expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise SlurmError(expected(text, f"at most {MAX_HOSTS} hosts", "hostlist"))
    return hosts
