"""The ``/proc`` formats numarun reads in more than one place (``/proc/<pid>/status``, ``mounts``,
``cgroup``), and the one walk of this process's cgroups, v1 and v2, that the sysfs reader, the
step's cpuset, the launcher's cage and its out-of-memory report share. Pure: files are read
through a callable."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence


def status_field(text: str, name: str) -> str | None:
    """The value of field ``name`` in a ``/proc/<pid>/status`` text (``Key:\\tvalue`` lines), stripped;
    None when the field is absent (``Cpus_allowed_list`` and ``Mems_allowed_list`` since Linux 2.6.26)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None


def cgroup2_mount(mounts_text: str) -> str | None:
    """Where the cgroup v2 (unified) hierarchy is mounted, from a ``/proc/self/mounts`` text; None without one."""
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return None


def own_cgroup2_path(cgroup_text: str) -> str | None:
    """This process's cgroup v2 path (``/`` for the root), from a ``/proc/self/cgroup`` text; None
    when it has no v2 line (``0::``)."""
    for line in cgroup_text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup_dirs(
    mounts: str | None, cgroup: str | None, controller: str, *, fallback: str | None = None
) -> list[tuple[int, str]]:
    """This process's cgroups that may hold ``controller``'s files, innermost first, as (cgroup
    version, directory): its v2 cgroup and each ancestor up to the v2 mount, then the same in the
    v1 hierarchy of ``controller``. ``mounts``/``cgroup``: the texts of ``/proc/self/mounts`` and
    ``/proc/self/cgroup``; without a mount table, the usual ``/sys/fs/cgroup`` (v2) and
    ``/sys/fs/cgroup/<controller>`` (v1). ``fallback``: the path where ``cgroup`` names none."""
    v1_mount = None
    for line in (mounts or "").splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "cgroup" and controller in f[3].split(","):
            v1_mount = f[1]
            break
    v1_path = None
    for line in (cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            v1_path = parts[2].strip() or "/"
    v2_mount = cgroup2_mount(mounts or "")
    trees = (
        (2, v2_mount if mounts else "/sys/fs/cgroup", own_cgroup2_path(cgroup or "")),
        (1, v1_mount if mounts else f"/sys/fs/cgroup/{controller}", v1_path),
    )
    out: list[tuple[int, str]] = []
    for version, mount, rel in trees:
        if mount is not None:
            parts = [p for p in (rel or fallback or "/").split("/") if p]
            out += [(version, posixpath.join(mount, *parts[:n])) for n in range(len(parts), -1, -1)]
    return out


def cgroup_read(
    dirs: Sequence[tuple[int, str]], names: Mapping[int, Sequence[str]], read: Callable[[str], str | None]
) -> tuple[str, str] | None:
    """The first of ``names[version]`` that ``read`` finds non-empty in ``dirs`` (innermost first):
    (its path, its text stripped); None when none is."""
    for version, d in dirs:
        for name in names.get(version, ()):
            text = read(posixpath.join(d, name))
            if text and text.strip():
                return posixpath.join(d, name), text.strip()
    return None
