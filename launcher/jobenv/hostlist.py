"""Slurm hostlist expressions (``node[01-03,07]``, ``a[1-2]b[3-4]``) -> host names, by ``scontrol show hostnames``'
rules, so that every task finds the node order without asking slurmctld (pure)."""

from __future__ import annotations

import itertools

from ..errors import SlurmError, expected

FORM = "a Slurm hostlist such as 'node[01-03,07]' or 'a[1-2]b[3-4],login1'"
MAX_HOSTS = 1_000_000  # '[1-99999999]' would otherwise allocate without bound


def _split_top(text: str, original: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    if "[" not in text and "]" not in text:
        return text.split(",")
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmError(expected(original, FORM, "hostlist"))
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(expected(original, FORM, "hostlist"))
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmError(expected(original, FORM, "hostlist"))
    parts.append("".join(cur))
    return parts


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
    segments: list[list[str]] = []
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            segments.append([rest])
            break
        if open_at:
            segments.append([rest[:open_at]])
        close_at = rest.find("]", open_at)
        if close_at < 0:
            raise SlurmError(expected(original, FORM, "hostlist"))
        segments.append(_expand_range(rest[open_at + 1 : close_at], original))
        rest = rest[close_at + 1 :]
    total = 1
    for seg in segments:
        total *= len(seg)
    if total > MAX_HOSTS:
        raise SlurmError(expected(original, f"at most {MAX_HOSTS} hosts", "hostlist"))
    return ["".join(combo) for combo in itertools.product(*segments)]


def expand_hostlist(text: str) -> list[str]:
    """All host names of a hostlist, in order, duplicates kept (as ``scontrol show hostnames``)."""
    stripped = text.strip()
    if not stripped or any(c.isspace() for c in stripped):
        raise SlurmError(expected(text, FORM, "hostlist"))
    hosts: list[str] = []
    for item in _split_top(stripped, text):
        if not item:
            raise SlurmError(expected(text, FORM, "hostlist"))
        hosts.extend(_expand_item(item, text))
        if len(hosts) > MAX_HOSTS:
            raise SlurmError(expected(text, f"at most {MAX_HOSTS} hosts", "hostlist"))
    return hosts
