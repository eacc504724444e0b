"""``numarun doctor``: pre-flight checks of a node (and of every node of a job).

- :mod:`.model`: findings and node reports (frozen, JSON-able).
- :mod:`.checks`: pure checks over a :class:`~numarun.topology.model.Topology` and recorded
  probe answers (RDMA port states, NVML health) -> findings.
- :mod:`.probe`: the I/O: reads what the Topology does not carry, below a ``root``.
- :mod:`.measure`: bounded bandwidth measurements (memory per NUMA node, host<->device).
- :mod:`.compare`: pure comparison of node reports (versions, GPUs, NICs, slow nodes and links).
- :mod:`.schedule`: which node pairs measure their link in which round (all pairs, or bounded). Pure.
- :mod:`.multinode`: the exchange between nodes over a c10d TCPStore and TCP streams.
"""
