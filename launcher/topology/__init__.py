"""Topology: the frozen model of one node, and the code that reads it (discovery)."""

from .model import Cpu, Gpu, Nic, NicKind, NumaNode, Topology

__all__ = ["Cpu", "Gpu", "Nic", "NicKind", "NumaNode", "Topology"]
