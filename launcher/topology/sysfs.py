"""Read a node's topology from a Linux ``/sys`` + ``/proc`` tree.

This module is the only code that reads the machine from ``/sys`` and ``/proc`` (a worker
reads back its own binding from ``/proc/self`` in ``worker/affinity.py``). Every path goes through
``root`` so that tests run on recorded trees (hwloc's ``hwloc-gather-topology`` captures,
our own ``live-h200-vm`` capture) exactly as on the live machine (``root == Path("/")``).

What is read (kernel docs: ``Documentation/admin-guide/cputopology.rst``,
``Documentation/ABI/stable/sysfs-devices-node``, ``Documentation/ABI/testing/sysfs-bus-pci``):

- NUMA nodes: ``sys/devices/system/node/node<N>/{cpulist,meminfo,distance}`` (``cpumap``
  when an old kernel has no ``cpulist``).
- CPUs: ``sys/devices/system/cpu/cpu<N>/topology/{physical_package_id,die_id,core_id,
  thread_siblings_list}``, ``cpu/online``, and the highest ``cache/index*/level`` for the LLC.
- Allowed CPUs / memory nodes: ``os.sched_getaffinity(0)`` live, else ``proc/self/status``, both
  narrowed by the process's cpuset cgroup, v2 or v1 (:func:`numarun.topology.procfs.cgroup_dirs`).
- GPUs: ``sys/bus/pci/devices/*`` whose ``vendor``, ``class`` and ``device`` pass the GPU rule
  of :mod:`numarun.topology.pci` (NVIDIA/AMD display classes, on-board VGA chips left out).
  A device whose ``vendor`` file is missing counts as NVIDIA when the NVIDIA driver lists it in
  ``proc/driver/nvidia/gpus/<bus id>`` (trimmed captures keep only ``class``).
  ``proc/driver/nvidia/gpus/*/numa_status`` gives the NUMA node of the GPU's own memory
  (POWER9/GH200 coherent memory).
- NICs: ``sys/class/infiniband/*`` (RDMA devices) and ``sys/class/net/*`` whose device sits
  under a PCI device (plain Ethernet; virtual interfaces and RDMA netdevs are skipped).

Recorded trees may not keep symlinks; a capture can list them in ``links.json`` at its root
(``{"/sys/bus/pci/devices/0000:00:06.0": "/sys/devices/pci0000:00/0000:00:06.0", ...}``).

Defaults (each one taken is recorded in ``Topology.notes`` unless marked "silent"):

- no ``sys/devices/system/node`` (kernel without NUMA): one node 0 holding every CPU, memory
  from ``proc/meminfo`` MemTotal (0 if absent).
- node ``meminfo`` missing or without ``MemTotal``: ``memory_bytes = 0``.
- node ``distance`` missing, malformed or not one entry per node: ``distances = ()``.
- the set of CPUs is the ``cpu<N>`` directories plus the ``present`` list; node cpulists are
  intersected with it (trimmed captures list CPUs they removed).
- ``cpu/online`` missing: a CPU is online when its ``online`` file says 1, else when its
  ``topology`` directory exists (the kernel removes it for offline CPUs) (silent).
- an offline CPU without a ``topology`` directory: package, core = -1, no siblings, llc = -1;
  NUMA node from the node cpulists (silent: that is what the kernel shows).
- ``die_id`` missing (kernels before 5.2): die 0 (silent). ``thread_siblings_list`` missing:
  the CPU alone. No cache information: llc = -1 (silent).
- ``proc/self/status`` missing or without ``Cpus_allowed_list``: every CPU allowed; without
  ``Mems_allowed_list``: ``allowed_mems = ()`` (all).
- PCI ``numa_node`` missing, unreadable or ``-1``: -1 (unknown); ``local_cpulist`` missing: ().
- RDMA ports: ``ports/<N>/{state,link_layer,rate}``; without ``link_layer`` (old kernels): InfiniBand;
  without ``state``: unknown (taken as up). Unreadable ``rate`` / ``speed``
  (``-1`` or EINVAL when the link is down): speed 0 (silent).

Errors: an unreadable essential file (a node ``cpulist``; a CPU's ``physical_package_id`` or
``core_id`` when its topology directory exists), binary content, a truncated or reversed list
(``0-``, ``3-1``) raise :class:`TopologyError` naming the file and the expected form.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .. import jsonable
from ..argtypes import ascii_digits
from ..cpuset import parse_list, parse_mask
from ..errors import CpuListError, TopologyError
from .fileio import read_bounded
from .model import Cpu, Gpu, Nic, NicKind, NumaNode, PcieLink, RdmaPort, Topology, normalize_bus_id
from .pci import gpu_vendor, is_onboard_vga, pci_order
from .procfs import cgroup_dirs, cgroup_read, status_field

log = logging.getLogger(__name__)

_BDF_COMPONENT = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_INT = re.compile(r"^-?\d+$")
_MAX_LINK_HOPS = 40
T = TypeVar("T")


def _integer(text: str) -> int:
    if not _INT.match(text.strip()):
        raise ValueError(text)
    return int(text)


@dataclass
class _Reader:
    """File access below ``root`` with uniform errors, plus the notes of defaults taken."""

    root: Path
    notes: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def show(self, p: Path) -> str:
        """A path as the user knows it: relative to the root, shown as absolute."""
        return "/" + str(p.relative_to(self.root)).lstrip("/")

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def text(self, p: Path, *, form: str) -> str | None:
        """File content as text, None when absent or unreadable (sysfs EINVAL/EIO)."""
        try:
            data = read_bounded(p, shown=self.show(p))
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise TopologyError(
                f"bad topology file {self.show(p)!r}: a directory; expected a file holding {form}"
            ) from None
        except OSError:
            return None
        # Some captures end files with a NUL (copied with a fixed-size read); only a NUL
        # inside the content means binary garbage.
        data = data.rstrip(b"\0")
        if b"\0" in data:
            raise TopologyError(f"bad topology file {self.show(p)!r}: binary content; expected {form}")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise TopologyError(f"bad topology file {self.show(p)!r}: not text; expected {form}") from None

    def parsed(self, p: Path, parse: Callable[[str], T], *, form: str, expected: str = "") -> T | None:
        """The file's text through ``parse`` (None when absent); text ``parse`` refuses is one line naming the file."""
        text = self.text(p, form=form)
        if text is None:
            return None
        try:
            return parse(text)
        except (CpuListError, ValueError):
            raise TopologyError(
                f"bad topology file {self.show(p)!r}: {text.strip()[:80]!r}; expected {expected or form}"
            ) from None

    def cpulist(self, p: Path, *, what: str = "a cpu list such as '0-3,8'") -> tuple[int, ...] | None:
        return self.parsed(p, parse_list, form=what, expected=f"{what} (ascending ranges)")

    def cpus(self, d: Path, list_name: str, mask_name: str) -> tuple[int, ...] | None:
        """The cpulist ``d/list_name``, else (older kernels) the hex cpumask ``d/mask_name``; None without both."""
        found = self.cpulist(d / list_name)
        if found is None:
            found = self.parsed(d / mask_name, parse_mask, form="a hex cpumask such as '00000000,0000ffff'")
        return found

    def integer(self, p: Path, *, form: str = "an integer") -> int | None:
        return self.parsed(p, _integer, form=form)

    def hexint(self, p: Path, *, form: str) -> int | None:
        return self.parsed(p, lambda text: int(text.strip(), 16), form=form)

    def resolve(self, p: Path) -> Path:
        """Follow symlinks inside the tree: absolute targets are taken relative to ``root``."""
        hops = 0
        parts = list(p.relative_to(self.root).parts)
        cur = self.root
        i = 0
        while i < len(parts):
            nxt = cur / parts[i]
            target = os.readlink(nxt) if nxt.is_symlink() else self.links.get(self.show(nxt))
            if target is None:
                cur = nxt
                i += 1
                continue
            hops += 1
            if hops > _MAX_LINK_HOPS:
                raise TopologyError(f"bad topology tree: symlink loop at {self.show(nxt)!r}; expected a sysfs tree")
            # Rebuild from the link's directory (an absolute target: from the root), applying '..' lexically
            # (sysfs links are relative and clean).
            rebuilt = posixpath.normpath(posixpath.join("/", *cur.relative_to(self.root).parts, target))
            parts = [x for x in rebuilt.split("/") if x] + parts[i + 1 :]
            # Walk again from the root: the target itself may pass through links.
            cur = self.root
            i = 0
        return cur


def read_sysfs(root: Path | str) -> Topology:
    """Build a :class:`Topology` from the tree at ``root`` (``/`` for the live machine)."""
    root = Path(root)
    live = root.resolve() == Path("/")
    r = _Reader(root)
    if not r.path("sys/devices/system/cpu").is_dir():
        raise TopologyError(
            f"bad topology tree {str(root)!r}: no sys/devices/system/cpu; expected a directory standing "
            "for a machine's '/' (holding sys/ and proc/)"
        )
    links_file = r.path("links.json")
    if not live and links_file.is_file():
        try:
            data = jsonable.loads(read_bounded(links_file, shown=str(links_file)))
            if isinstance(data, dict):
                r.links = {str(k): str(v) for k, v in data.items()}
        except (ValueError, UnicodeDecodeError):
            r.note("links.json unreadable; recorded symlinks ignored")

    cpu_ids = _cpu_universe(r)
    nodes, cpu_node = _read_nodes(r, cpu_ids)
    cpus = _read_cpus(r, cpu_ids, cpu_node, live=live)
    allowed_mems = _allowed_mems(r, [n.id for n in nodes])
    nv_driver = _nvidia_driver_gpus(r)
    gpus = _read_gpus(r, nv_driver)
    nics = _read_nics(r)
    return Topology(
        hostname=_hostname(r, live),
        numa_nodes=nodes,
        cpus=cpus,
        gpus=gpus,
        nics=nics,
        allowed_mems=allowed_mems,
        source="live" if live else f"sysfs:{root}",
        gpu_source="sysfs" if gpus else "none",
        notes=tuple(r.notes),
        kernel_modules=read_kernel_modules(r),
    )


# --- CPUs and NUMA nodes -------------------------------------------------------------


def _cpu_universe(r: _Reader) -> tuple[int, ...]:
    base = r.path("sys/devices/system/cpu")
    ids = {int(p.name[3:]) for p in base.iterdir() if re.fullmatch(r"cpu\d+", p.name) and p.is_dir()}
    present = r.cpulist(base / "present")
    if present is not None:
        ids.update(present)
    if not ids:
        raise TopologyError(
            f"bad topology tree {str(r.root)!r}: no CPUs under sys/devices/system/cpu; expected cpu<N> directories"
        )
    return tuple(sorted(ids))


def _read_nodes(r: _Reader, cpu_ids: tuple[int, ...]) -> tuple[tuple[NumaNode, ...], dict[int, int]]:
    base = r.path("sys/devices/system/node")
    node_dirs = sorted(
        (int(p.name[4:]), p) for p in (base.iterdir() if base.is_dir() else ()) if re.fullmatch(r"node\d+", p.name)
    )
    universe = set(cpu_ids)
    if not node_dirs:
        r.note("no NUMA information (sys/devices/system/node absent): one node 0 with every CPU")
        mem = _meminfo_total(r, r.path("proc/meminfo"), key="MemTotal:")
        return (NumaNode(id=0, cpus=cpu_ids, memory_bytes=mem or 0),), {c: 0 for c in cpu_ids}
    ids = [i for i, _ in node_dirs]
    possible = r.cpulist(base / "possible", what="a node list such as '0-1'") or ()
    raw: list[tuple[int, tuple[int, ...], int, tuple[int, ...]]] = []
    cpu_node: dict[int, int] = {}
    for nid, d in node_dirs:
        cl = r.cpus(d, "cpulist", "cpumap")  # kernels before 2.6.27 have only the hex cpumap
        if cl is None:
            raise TopologyError(
                f"bad topology tree: {r.show(d / 'cpulist')!r} missing; "
                "expected a cpu list such as '0-3,8' (empty for a CPU-less node)"
            )
        cpus = tuple(c for c in cl if c in universe)
        for c in cpus:
            cpu_node.setdefault(c, nid)
        mem = _meminfo_total(r, d / "meminfo", key="MemTotal:")
        if mem is None:
            r.note(f"node{nid}: no MemTotal in meminfo; memory taken as 0")
            mem = 0
        dist = _distance_row(r, d / "distance", ids, possible)
        raw.append((nid, cpus, mem, dist))
    # Distances are a matrix: keep them only when every row is known.
    dists_ok = all(row for *_, row in raw)
    nodes = tuple(
        NumaNode(id=nid, cpus=cpus, memory_bytes=mem, distances=dist if dists_ok else (), memory_only=not cpus)
        for nid, cpus, mem, dist in raw
    )
    return nodes, cpu_node


def _meminfo_total(r: _Reader, p: Path, *, key: str) -> int | None:
    text = r.text(p, form="meminfo lines such as 'Node 0 MemTotal: 1024 kB'")
    if text is None:
        return None
    for line in text.splitlines():
        if key in line:
            m = re.search(re.escape(key) + r"\s*(\d+)\s*kB", line)
            if m:
                return int(m.group(1)) * 1024
            r.note(f"{r.show(p)}: unreadable {key[:-1]} line; memory taken as 0")
            return 0
    return None


def _distance_row(r: _Reader, p: Path, ids: list[int], possible: tuple[int, ...]) -> tuple[int, ...]:
    """The row aligned with ``ids``. The kernel prints one entry per online node; an edited
    or racing capture may print one per possible node instead, which we realign."""
    text = r.text(p, form="space-separated distances such as '10 21'")
    if text is None:
        r.note(f"{r.show(p)} missing; NUMA distances unknown")
        return ()
    parts = text.split()
    if all(ascii_digits(x) for x in parts):
        if len(parts) == len(ids):
            return tuple(int(x) for x in parts)
        if len(parts) == len(possible) and set(ids) <= set(possible):
            return tuple(int(parts[possible.index(i)]) for i in ids)
    r.note(f"{r.show(p)}: {text.strip()[:40]!r} is not {len(ids)} distances; NUMA distances unknown")
    return ()


def _read_cpus(r: _Reader, cpu_ids: tuple[int, ...], cpu_node: dict[int, int], *, live: bool) -> tuple[Cpu, ...]:
    base = r.path("sys/devices/system/cpu")
    online_list = r.cpulist(base / "online")
    allowed = _allowed_cpus(r, cpu_ids, live=live)
    out: list[Cpu] = []
    for cid in cpu_ids:
        d = base / f"cpu{cid}"
        topo = d / "topology"
        has_topo = topo.is_dir()
        if online_list is not None:
            online = cid in online_list
        else:
            flag = r.integer(d / "online", form="0 or 1")
            online = bool(flag) if flag is not None else has_topo
        node = cpu_node.get(cid, -1)
        if not has_topo:
            if online:
                r.note(f"cpu{cid}: listed online but has no topology directory; taken as offline")
            out.append(Cpu(id=cid, package=-1, core=-1, numa_node=node, online=False, allowed=cid in allowed))
            continue
        pkg = r.integer(topo / "physical_package_id")
        core = r.integer(topo / "core_id")
        if pkg is None:
            raise TopologyError(
                f"bad topology tree: {r.show(topo / 'physical_package_id')!r} missing; expected an integer package id"
            )
        if core is None:
            raise TopologyError(f"bad topology tree: {r.show(topo / 'core_id')!r} missing; expected an integer core id")
        die = r.integer(topo / "die_id")
        sib = r.cpus(topo, "thread_siblings_list", "thread_siblings")  # the mask: kernels before 2.6.26
        out.append(
            Cpu(
                id=cid,
                package=pkg,
                core=core,
                numa_node=node,
                die=die if die is not None and die >= 0 else 0,
                siblings=sib if sib else (cid,),
                llc=_llc(r, d / "cache"),
                online=online,
                allowed=cid in allowed,
            )
        )
    return tuple(out)


def _llc(r: _Reader, cache: Path) -> int:
    if not cache.is_dir():
        return -1
    best: tuple[int, tuple[int, ...]] | None = None
    for idx in sorted(cache.glob("index*")):
        level = r.integer(idx / "level", form="a cache level such as 3")
        ctype = (r.text(idx / "type", form="a cache type") or "").strip()
        shared = r.cpus(idx, "shared_cpu_list", "shared_cpu_map")
        if level is None or ctype == "Instruction" or not shared:
            continue
        if best is None or level > best[0]:
            best = (level, shared)
    return min(best[1]) if best else -1


def _parse_status_list(r: _Reader, name: str) -> tuple[int, ...] | None:
    text = r.text(r.path("proc/self/status"), form="'Key:\\tvalue' lines")
    value = status_field(text, name) if text is not None else None
    if value is None:
        return None
    try:
        return parse_list(value)
    except CpuListError:
        raise TopologyError(
            f"bad topology file '/proc/self/status': {name} {value[:80]!r}; expected a list such as '0-3,8'"
        ) from None


def _cgroup_effective(r: _Reader, name: str) -> tuple[int, ...] | None:
    """The ``cpus`` or ``mems`` of this process's cpuset cgroup (v2 ``cpuset.<name>.effective``, v1
    ``cpuset.<name>``, as hwloc reads them), if recorded. hwloc captures record the path in ``proc/self/cpuset``."""
    cs = r.text(r.path("proc/self/cpuset"), form="a cgroup path")
    dirs = cgroup_dirs(
        r.text(r.path("proc/mounts"), form="mount table lines"),
        r.text(r.path("proc/self/cgroup"), form="'id:controllers:path' lines"),
        "cpuset",
        fallback=cs.strip() if cs and cs.strip().startswith("/") else None,
    )
    found = cgroup_read(
        dirs,
        {2: (f"cpuset.{name}.effective",), 1: (f"cpuset.{name}",)},
        lambda p: r.text(r.path(p), form="a cpu list such as '0-3,8'"),
    )
    return r.cpulist(r.path(found[0])) if found else None


def _allowed_cpus(r: _Reader, cpu_ids: tuple[int, ...], *, live: bool) -> set[int]:
    if live:
        allowed = set(os.sched_getaffinity(0))
    else:
        lst = _parse_status_list(r, "Cpus_allowed_list")
        if lst is None:
            r.note("no Cpus_allowed_list in /proc/self/status: every CPU taken as allowed")
            allowed = set(cpu_ids)
        else:
            allowed = set(lst)
    eff = _cgroup_effective(r, "cpus")
    if eff is not None:
        allowed &= set(eff)
    return allowed


def _allowed_mems(r: _Reader, node_ids: list[int]) -> tuple[int, ...]:
    lst = _parse_status_list(r, "Mems_allowed_list")
    eff = _cgroup_effective(r, "mems")
    if lst is None and eff is None:
        r.note("no Mems_allowed_list in /proc/self/status: every NUMA node taken as allowed")
        return ()
    allowed = set(lst) if lst is not None else set(node_ids)
    if eff is not None:
        allowed &= set(eff)
    return tuple(sorted(a for a in allowed if a in node_ids))


# --- PCI: GPUs and NICs --------------------------------------------------------------


def _pci_chain(r: _Reader, dev: Path) -> tuple[str, ...]:
    """Normalised bus ids from the root port down to the device, from its resolved path."""
    parts = r.resolve(dev).relative_to(r.root).parts
    if len(parts) < 3 or parts[:2] != ("sys", "devices") or not parts[2].startswith("pci"):
        return ()
    return tuple(normalize_bus_id(p) for p in parts[3:] if _BDF_COMPONENT.match(p))


def _pci_numa(r: _Reader, dev: Path) -> int:
    try:
        n = r.integer(dev / "numa_node")
    except TopologyError:
        r.note(f"{r.show(dev / 'numa_node')}: not an integer; NUMA node unknown")
        return -1
    return n if n is not None and n >= 0 else -1


def _nvidia_driver_gpus(r: _Reader) -> dict[str, tuple[int, int]]:
    """The NVIDIA driver's per-GPU files: bus id -> (memory NUMA node, device minor), -1 when unknown.

    ``numa_status`` names the GPU memory's own NUMA node on coherent systems (GH200);
    ``information`` has ``Device Minor:``, the N of ``/dev/nvidiaN``.
    """
    base = r.path("proc/driver/nvidia/gpus")
    out: dict[str, tuple[int, int]] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        try:
            bus = normalize_bus_id(d.name)
        except TopologyError:
            continue
        node = minor = -1
        text = r.text(d / "numa_status", form="'Node: N' lines")
        if text:
            m = re.search(r"^Node:\s*(-?\d+)", text, re.M)
            if m and int(m.group(1)) >= 0:
                node = int(m.group(1))
        info = r.text(d / "information", form="'Key: value' lines with 'Device Minor: N'")
        if info:
            m = re.search(r"^Device Minor:\s*(\d+)\s*$", info, re.M)
            if m:
                minor = int(m.group(1))
            else:
                r.note(f"{r.show(d / 'information')}: no 'Device Minor: N' line; the GPU's minor number is unknown")
        out[bus] = (node, minor)
    return out


def _read_gpus(r: _Reader, nv_driver: dict[str, tuple[int, int]]) -> tuple[Gpu, ...]:
    base = r.path("sys/bus/pci/devices")
    if not base.is_dir():
        return ()
    found: list[Gpu] = []
    for d in base.iterdir():
        try:
            bus = normalize_bus_id(d.name)
        except TopologyError:
            continue
        cls = r.hexint(d / "class", form="a PCI class such as '0x030200'")
        if cls is None:
            continue
        vendor_id = r.hexint(d / "vendor", form="a PCI vendor id such as '0x10de'")
        if vendor_id is None and bus in nv_driver:
            vendor_id = 0x10DE
        vendor = gpu_vendor(vendor_id, cls >> 8)
        if vendor is None:
            continue
        device_id = r.hexint(d / "device", form="a PCI device id such as '0x2335'")
        if is_onboard_vga(vendor_id, device_id):
            continue
        name = f"PCI {vendor_id:04x}:{device_id:04x}" if device_id is not None else f"PCI {vendor_id:04x}"
        affinity = r.cpulist(d / "local_cpulist") or ()
        memory_node, minor = nv_driver.get(bus, (-1, -1))
        found.append(
            Gpu(
                index=0,
                pci_bus_id=bus,
                numa_node=_pci_numa(r, d),
                name=name,
                vendor=vendor,
                cpu_affinity=affinity,
                memory_numa_node=memory_node,
                minor=minor,
                pci_path=_pci_chain(r, d) or (bus,),
                pcie_link=read_pcie_link(r, d),
            )
        )
    return tuple(Gpu(**{**g.__dict__, "index": i}) for i, g in enumerate(pci_order(tuple(found))))


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_PORT_STATE = re.compile(r"^\s*(?:\d+\s*:\s*)?([A-Z_]+)\s*$")


def _read_rdma_ports(r: _Reader, dev: Path) -> tuple[RdmaPort, ...]:
    """``<dev>/ports/<N>/{state,link_layer,rate}`` (Documentation/ABI/stable/sysfs-class-infiniband).

    ``state`` reads ``4: ACTIVE``; a port without one has state "" (unknown, taken as up).
    """
    ports = dev / "ports"
    out: list[RdmaPort] = []
    for port in sorted(ports.iterdir(), key=lambda p: (len(p.name), p.name)) if ports.is_dir() else ():
        if not port.name.isdigit():
            continue
        ll = r.text(port / "link_layer", form="'InfiniBand' or 'Ethernet'")
        if ll is None:
            r.note(f"{dev.name}: port {port.name} has no link_layer; taken as InfiniBand")
        layer = (ll or "").strip() or "InfiniBand"  # kept as written: the doctor flags layers the plan cannot use
        rate = r.text(port / "rate", form="a rate such as '200 Gb/sec (4X HDR)'") or ""
        m = _RATE.match(rate)
        state_text = r.text(port / "state", form="a port state such as '4: ACTIVE'")
        sm = _PORT_STATE.match(state_text or "")
        if state_text is not None and not sm:
            r.note(
                f"{r.show(port / 'state')}: {state_text.strip()[:40]!r} is not a port state such as '4: ACTIVE'; state "
                "unknown"
            )
        out.append(
            RdmaPort(
                number=int(port.name),
                state=sm.group(1) if sm else "",
                link_layer=layer,
                rate_gbps=float(m.group(1)) if m else 0.0,
            )
        )
    return tuple(out)


def _read_nics(r: _Reader) -> tuple[Nic, ...]:
    nics: list[Nic] = []
    owned: set[str] = set()
    ib = r.path("sys/class/infiniband")
    if ib.is_dir():
        for d in sorted(ib.iterdir(), key=lambda p: p.name):
            dev = d / "device"
            chain = _pci_chain(r, dev)
            if not chain:
                continue  # not backed by a PCI function (e.g. scif, rxe soft-RoCE)
            ports = _read_rdma_ports(r, d)
            speed = max((int(p.rate_gbps * 1000) for p in ports), default=0)
            kind = NicKind.ROCE if ports and all(p.link_layer == "Ethernet" for p in ports) else NicKind.INFINIBAND
            netdir = r.resolve(dev) / "net"
            netdevs = tuple(sorted(p.name for p in netdir.iterdir())) if netdir.is_dir() else ()
            owned.update(netdevs)
            nics.append(
                Nic(
                    name=d.name,
                    pci_bus_id=chain[-1],
                    numa_node=_pci_numa(r, r.resolve(dev)),
                    kind=kind,
                    netdevs=netdevs,
                    speed_mbps=speed,
                    pci_path=chain,
                    ports=ports,
                    pcie_link=read_pcie_link(r, r.resolve(dev)),
                )
            )
    net = r.path("sys/class/net")
    if net.is_dir():
        for d in sorted(net.iterdir(), key=lambda p: p.name):
            if d.name in owned:
                continue
            chain = _pci_chain(r, d / "device")
            if not chain:
                continue  # virtual interface (lo, bridges, VLANs, ifb)
            try:
                speed = r.integer(d / "speed") or 0
            except TopologyError:
                r.note(f"{r.show(d / 'speed')}: not an integer; speed unknown")
                speed = 0
            pci_dev = r.path("sys/bus/pci/devices") / chain[-1]
            if not pci_dev.exists():
                pci_dev = _pci_parent(r, r.resolve(d / "device"))
            nics.append(
                Nic(
                    name=d.name,
                    pci_bus_id=chain[-1],
                    numa_node=_pci_numa(r, pci_dev),
                    kind=NicKind.ETHERNET,
                    netdevs=(d.name,),
                    speed_mbps=max(speed, 0),
                    pci_path=chain,
                    pcie_link=read_pcie_link(r, pci_dev),
                )
            )
    return tuple(nics)


_GTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def read_pcie_link(r: _Reader, dev: Path) -> PcieLink:
    """``current_link_speed``/``_width`` and ``max_link_speed``/``_width`` of a PCI function.

    Speeds read "16.0 GT/s PCIe" (older kernels: "8 GT/s"); "Unknown" or a missing file
    is 0 (silent: virtio and emulated functions have no link).
    """

    def speed(name: str) -> float:
        m = _GTS.match(r.text(dev / name, form="a speed such as '16.0 GT/s PCIe'") or "")
        return float(m.group(1)) if m else 0.0

    def width(name: str) -> int:
        t = (r.text(dev / name, form="a lane count such as '16'") or "").strip()
        return int(t) if t.isdigit() else 0

    return PcieLink(
        current_gts=speed("current_link_speed"),
        current_width=width("current_link_width"),
        max_gts=speed("max_link_speed"),
        max_width=width("max_link_width"),
    )


def read_kernel_modules(r: _Reader) -> tuple[str, ...] | None:
    """Loaded modules: the names in ``proc/modules``, else the ``sys/module`` directories
    that have an ``initstate`` (built-in code also appears there, without one); None when
    neither was recorded."""
    text = r.text(r.path("proc/modules"), form="'name size refcount ...' lines")
    if text is not None:
        return tuple(sorted({line.split()[0] for line in text.splitlines() if line.strip()}))
    base = r.path("sys/module")
    if not base.is_dir():
        return None
    return tuple(sorted(d.name for d in base.iterdir() if (d / "initstate").exists()))


def _pci_parent(r: _Reader, real: Path) -> Path:
    """The nearest ancestor of ``real`` that is a PCI function directory (virtio sits below one)."""
    p = real
    while p != r.root and not _BDF_COMPONENT.match(p.name):
        p = p.parent
    return p


def _hostname(r: _Reader, live: bool) -> str:
    if live:
        return socket.gethostname()
    text = r.text(r.path("proc/sys/kernel/hostname"), form="a host name")
    return text.strip() if text and text.strip() else r.root.name
