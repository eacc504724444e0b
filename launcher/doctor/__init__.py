"""``numarun doctor``: pre-flight checks of a node, and of every node of a job (docs/scale.md).

Pure: ``model``, ``checks``, ``compare``, ``schedule``; I/O: ``node``, ``measure`` (a child process), ``multinode``.
"""
