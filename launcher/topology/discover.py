"""Choose a topology source and load it: the live machine, a recorded tree, or a saved file.

``load_topology(source)``:

- ``None``: the path in env ``NUMARUN_TOPOLOGY`` when set, else the live machine
  (``/`` through :mod:`numarun.topology.sysfs`, plus NVML GPUs when pynvml and a driver
  are present).
- a directory: a machine's ``/`` (holding ``sys/`` and ``proc/``), e.g. an extracted capture.
- a tarball of such a tree (``.tar.bz2`` as ``hwloc-gather-topology`` writes, ``.tar.gz``...):
  extracted once into ``~/.cache/numarun/trees`` (:mod:`numarun.topology.archive`).
- a ``.json`` file: a snapshot written by ``numarun topo --json``.
- a ``.xml`` file: an hwloc v2 XML (``lstopo out.xml``).
- any other file: a saved ``nvidia-smi topo -m`` text.

NVML GPUs replace sysfs PCI GPUs, matched by normalised PCI bus id. NVML's NUMA node wins
when it knows one, otherwise sysfs's ``numa_node`` is kept (NVML answers -1 in many VMs).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TopologyError
from .model import Gpu, Topology, normalize_bus_id

if TYPE_CHECKING:
    from .nvml import NvmlReading

log = logging.getLogger(__name__)

ENV_VAR = "NUMARUN_TOPOLOGY"
ACCEPTED = (
    "a directory standing for a machine's '/' (holding sys/ and proc/) or a tarball of one, a .json snapshot from "
    "'numarun topo --json', an hwloc .xml file, or a saved 'nvidia-smi topo -m' text"
)


def load_topology(source: str | None = None) -> Topology:
    """Load the topology named by ``source`` (see the module docstring for the forms)."""
    if source is None:
        env = os.environ.get(ENV_VAR, "").strip()
        if env:
            log.debug("topology from %s=%s", ENV_VAR, env)
            source = env
    if source is None:
        return read_live()
    path = Path(source).expanduser()
    if not path.exists():
        raise TopologyError(f"topology source {source!r} does not exist: expected {ACCEPTED}")
    if path.is_dir():
        from .sysfs import read_sysfs

        if path.resolve() == Path("/"):
            return read_live()
        topo = read_sysfs(path)
        return dataclasses.replace(topo, source=f"sysfs:{source}")
    from .archive import extract_tree, is_tarball

    if is_tarball(path):
        from .sysfs import read_sysfs

        return dataclasses.replace(read_sysfs(extract_tree(path)), source=f"sysfs:{source}")
    text = _read_text(path, source)
    suffix = path.suffix.lower()
    if suffix == ".json":
        # A snapshot keeps the source it recorded, so `topo --json` of it is byte-identical.
        return Topology.from_json(text, origin=source)
    if suffix == ".xml":
        from .hwloc_xml import read_hwloc_xml

        topo = read_hwloc_xml(text, origin=source)
        return dataclasses.replace(topo, source=f"hwloc:{source}")
    from .smi import topology_from_smi

    topo = topology_from_smi(text, source)
    return dataclasses.replace(topo, source=f"nvidia-smi:{source}")


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
    """This machine: sysfs/procfs at ``/`` plus NVML when available."""
    from .sysfs import read_sysfs

    topo = read_sysfs(Path("/"))
    reading, note = _nvml_reading()
    if note:
        topo = dataclasses.replace(topo, notes=topo.notes + (note,))
    return merge_nvml(topo, reading)


def _nvml_reading() -> tuple[NvmlReading | None, str]:
    from .nvml import read_nvml_gpus  # pynvml itself is imported, when present, by read_nvml_record

    try:
        return read_nvml_gpus(), ""
    except Exception as e:  # a driver fault must not stop a launch that can fall back to sysfs
        log.warning("NVML failed (%s); GPUs from sysfs", e)
        return None, f"NVML failed ({type(e).__name__}: {e}); GPUs from sysfs"


def merge_nvml(topo: Topology, reading: NvmlReading | None) -> Topology:
    """Pure: replace sysfs PCI GPUs by NVML's, matched by bus id; sets ``gpu_source``.

    A GPU that NVML reports keeps sysfs's NUMA node, CPU affinity and PCI path where NVML has
    none. sysfs GPUs that NVML does not list (AMD cards, GPUs NVML cannot see) are dropped
    with a note, since CUDA numbers only what the driver shows.
    """
    if reading is None or not reading.gpus:
        notes = topo.notes
        if reading is not None:
            notes += tuple(reading.notes) + ("NVML found no GPU",)
        return dataclasses.replace(topo, gpu_source="sysfs" if topo.gpus else "none", notes=notes)
    by_bus: dict[str, Gpu] = {}
    for g in topo.gpus:
        by_bus[normalize_bus_id(g.pci_bus_id)] = g
    merged: list[Gpu] = []
    merged_notes = list(topo.notes) + list(reading.notes)
    for g in reading.gpus:
        bus = normalize_bus_id(g.pci_bus_id)
        s = by_bus.pop(bus, None)
        if s is None:
            merged.append(dataclasses.replace(g, pci_bus_id=bus))
            continue
        merged.append(
            dataclasses.replace(
                g,
                pci_bus_id=bus,
                numa_node=g.numa_node if g.numa_node >= 0 else s.numa_node,
                cpu_affinity=g.cpu_affinity or s.cpu_affinity,
                memory_numa_node=g.memory_numa_node if g.memory_numa_node >= 0 else s.memory_numa_node,
                pci_path=g.pci_path or s.pci_path,
                minor=g.minor if g.minor >= 0 else s.minor,
            )
        )
    for bus in by_bus:
        merged_notes.append(f"PCI GPU {bus} not listed by NVML; left out")
    return dataclasses.replace(
        topo, gpus=tuple(merged), gpu_links=reading.gpu_links, gpu_source="nvml", notes=tuple(merged_notes)
    )


def device_root(source: str | None = None) -> Path | None:
    """The directory whose ``dev/`` and ``proc/`` stand for the machine ``source`` names: ``/`` for
    the live machine, the tree itself for a recorded tree; None for files (JSON, XML, text)."""
    if source is None:
        source = os.environ.get(ENV_VAR, "").strip() or None
    if source is None:
        return Path("/")
    path = Path(source).expanduser()
    return path if path.is_dir() else None
