"""The ``/proc/<pid>/status`` format, read by the sysfs reader (from a recorded or live tree) and
by a worker reading back its own binding (:mod:`numarun.launch.affinity`). Pure."""

from __future__ import annotations


def status_field(text: str, name: str) -> str | None:
    """The value of field ``name`` in a ``/proc/<pid>/status`` text (``Key:\\tvalue`` lines), stripped;
    None when the field is absent (``Cpus_allowed_list`` and ``Mems_allowed_list`` since Linux 2.6.26)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None
