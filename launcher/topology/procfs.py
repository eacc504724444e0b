"""The ``/proc`` formats numarun reads in more than one place. Pure.

``/proc/<pid>/status``: by the sysfs reader (from a recorded or live tree) and by a worker reading
back its own binding (:mod:`numarun.worker.affinity`). ``/proc/self/mounts`` and
``/proc/self/cgroup``, for this process's cgroup v2: by the sysfs reader (the cgroup's cpuset) and
by the launcher putting its job in a cgroup of its own (:mod:`numarun.launch.reaper`)."""

from __future__ import annotations


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
