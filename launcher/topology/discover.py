"""Choose a topology source and load it: the live machine, a recorded tree, or a saved file (forms:
docs/design-notes.md)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TopologyError
from .model import Gpu, Topology, normalize_bus_id

if TYPE_CHECKING:
    from .nvml import NvmlReading

log = logging.getLogger(__name__)

ACCEPTED = (
    "a directory standing for a machine's '/' (holding sys/ and proc/) or a tarball of one, a .json snapshot from "
    "'numarun topo --json', an hwloc .xml file, or a saved 'nvidia-smi topo -m' text"
)


def load_topology(source: str | None = None) -> Topology:
    """Load the topology named by ``source`` (None: the live machine). The launch options say which source
    (``--topology``, ``NUMARUN_TOPOLOGY``: :mod:`numarun.options.launch`)."""
    if source is None:
        return read_live()
    path = Path(source).expanduser()
    if not path.exists():
        raise TopologyError(f"topology source {source!r} does not exist: expected {ACCEPTED}")
    from .archive import extract_tree, is_tarball
    from .sysfs import read_sysfs

    if path.is_dir():
        if path.resolve() == Path("/"):
            return read_live()
        return dataclasses.replace(read_sysfs(path), source=f"sysfs:{source}")
    if is_tarball(path):
        return dataclasses.replace(read_sysfs(extract_tree(path)), source=f"sysfs:{source}")
    text = _read_text(path, source)
    suffix = path.suffix.lower()
    if suffix == ".json":  # keeps the source it recorded
        return Topology.from_json(text, origin=source)
    if suffix == ".xml":
        from .hwloc_xml import read_hwloc_xml

        return dataclasses.replace(read_hwloc_xml(text, origin=source), source=f"hwloc:{source}")
    from .smi import topology_from_smi

    return dataclasses.replace(topology_from_smi(text, source), source=f"nvidia-smi:{source}")


def _read_text(path: Path, source: str) -> str:
    from .fileio import read_bounded

    try:
        data = read_bounded(path, shown=source)
    except OSError as e:
        raise TopologyError(f"topology source {source!r} cannot be read ({e.strerror}): expected {ACCEPTED}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"topology source {source!r} is not text: expected {ACCEPTED}") from None


def read_live() -> Topology:
    from .nvml import read_nvml_gpus
    from .sysfs import read_sysfs

    topo = read_sysfs(Path("/"))
    try:
        reading = read_nvml_gpus()
    except Exception as e:  # a driver fault must not stop a launch that can fall back to sysfs
        log.warning("NVML failed (%s); GPUs from sysfs", e)
        reading = None
        topo = dataclasses.replace(topo, notes=(*topo.notes, f"NVML failed ({type(e).__name__}: {e}); GPUs from sysfs"))
    return merge_nvml(topo, reading)


def merge_nvml(topo: Topology, reading: NvmlReading | None) -> Topology:
    """Pure: replace sysfs PCI GPUs by NVML's, matched by bus id (rules: docs/design-notes.md); sets ``gpu_source``."""
    if reading is None or not reading.gpus:
        notes = topo.notes
        if reading is not None:
            notes += tuple(reading.notes) + ("NVML found no GPU",)
        return dataclasses.replace(topo, gpu_source="sysfs" if topo.gpus else "none", notes=notes)
    by_bus: dict[str, Gpu] = {normalize_bus_id(g.pci_bus_id): g for g in topo.gpus}
    merged: list[Gpu] = []
    merged_notes = list(topo.notes) + list(reading.notes)
    for g in reading.gpus:
        bus = normalize_bus_id(g.pci_bus_id)
        s = by_bus.pop(bus, g)  # a GPU sysfs did not list keeps NVML's figures alone
        merged.append(
            dataclasses.replace(
                g,
                pci_bus_id=bus,
                numa_node=g.numa_node if g.numa_node >= 0 else s.numa_node,
                cpu_affinity=g.cpu_affinity or s.cpu_affinity,
                pci_path=g.pci_path or s.pci_path,
                memory_numa_node=g.memory_numa_node if g.memory_numa_node >= 0 else s.memory_numa_node,
                minor=g.minor if g.minor >= 0 else s.minor,
            )
        )
    merged_notes += [f"PCI GPU {bus} not listed by NVML; left out" for bus in by_bus]
    return dataclasses.replace(
        topo, gpus=tuple(merged), gpu_links=reading.gpu_links, gpu_source="nvml", notes=tuple(merged_notes)
    )


def device_root(source: str | None = None) -> Path | None:
    """The directory whose ``dev/`` and ``proc/`` stand for the machine ``source`` names (None: this one); None for
    files."""
    if source is None:
        return Path("/")
    path = Path(source).expanduser()
    return path if path.is_dir() else None
