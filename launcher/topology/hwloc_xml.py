"""An hwloc 2.x/3.x XML topology (``lstopo out.xml``) -> Topology (pure; the mapping: docs/design-notes.md)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from ..cpuset import bits
from ..errors import TopologyError
from .model import PORT_STATES, Cpu, Gpu, Nic, NicKind, NumaNode, RdmaPort, Topology, normalize_bus_id
from .pci import gpu_vendor, is_onboard_vga, pci_order

_FORM = "an hwloc 2.x/3.x XML topology as written by 'lstopo out.xml'"
_PCI_TYPE = re.compile(r"^\s*([0-9a-fA-F]{4})\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_CACHE_LEVEL = re.compile(r"^L(\d)(?:d|u)?Cache$")
_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}


def parse_hwloc_set(text: str) -> tuple[int, ...]:
    """``"0x00000011,0x11111111"`` -> ids: 32-bit words, most significant first; ``0xf...f`` adds nothing."""
    words = [w.strip() for w in text.strip().split(",")]
    if words and words[0].lower().startswith("0xf...f"):
        words = words[1:]
    value = 0
    for w in words:
        h = (w[2:] if w.lower().startswith("0x") else w) or "0"
        if not re.fullmatch(r"[0-9a-fA-F]+", h):
            raise TopologyError(f"bad hwloc set {text[:60]!r}: expected a form such as '0x000000ff,0xffffffff'")
        value = (value << 32) | int(h, 16)
    return bits(value)


@dataclass
class _Ctx:
    package: int = -1
    die: int = 0
    core: int | None = None
    core_cpus: tuple[int, ...] = ()
    llc: tuple[int, ...] | None = None
    locality: ET.Element | None = None
    pci_chain: tuple[str, ...] = ()


@dataclass
class _State:
    cpus: dict[int, Cpu] = field(default_factory=dict)
    nodes: dict[int, tuple[tuple[int, ...], int, str]] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    package_of: dict[int, int] = field(default_factory=dict)  # places PUs that hwloc hid


def read_hwloc_xml(text: str, origin: str = "hwloc XML") -> Topology:
    """Parse hwloc XML text; ``origin`` names it in errors."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise TopologyError(f"bad hwloc XML {origin!r}: not XML ({e}); expected {_FORM}") from None
    if root.tag != "topology":
        raise TopologyError(f"bad hwloc XML {origin!r}: root element <{root.tag}>; expected {_FORM}")
    version = root.get("version", "")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 1
    if major < 2:
        raise TopologyError(
            f"bad hwloc XML {origin!r}: hwloc 1.x format (version {version or 'missing'!r}) is not supported; "
            f"expected {_FORM} (hwloc >= 2.0)"
        )
    top = root.find("object")
    if top is None:
        raise TopologyError(f"bad hwloc XML {origin!r}: no <object> under <topology>; expected {_FORM}")
    try:
        return _build(root, top, major, origin)
    except (ValueError, KeyError) as e:
        raise TopologyError(f"bad hwloc XML {origin!r}: {e}; expected {_FORM}") from None


def _attr_int(el: ET.Element, name: str, default: int) -> int:
    v = el.get(name)
    return int(v) if v is not None and re.fullmatch(r"-?\d+", v) else default


def _infos(el: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in el.findall("info")}


def _osdev_kind(el: ET.Element, major: int) -> str:
    t = el.get("osdev_type", "")
    if not t.isdigit():
        return ""
    n = int(t)
    if major >= 3:  # a bit mask
        return next((kind for bit, kind in ((32, "ofed"), (16, "net"), (4 | 8, "gpu")) if n & bit), "")
    return {1: "gpu", 2: "net", 3: "ofed", 5: "gpu"}.get(n, "")


def _build(root: ET.Element, top: ET.Element, major: int, origin: str) -> Topology:
    st = _State()
    _walk(top, _Ctx(locality=top), st, major)
    complete = parse_hwloc_set(top.get("complete_cpuset") or top.get("cpuset") or "0x0")
    allowed_attr = top.get("allowed_cpuset")
    allowed = set(parse_hwloc_set(allowed_attr)) if allowed_attr else None
    node_ids = sorted(st.nodes)
    cpu_node: dict[int, int] = {}
    for nid in node_ids:
        for cpu_id in st.nodes[nid][0]:
            cpu_node.setdefault(cpu_id, nid)
    cpus: list[Cpu] = []
    for cid in sorted(set(complete) | set(st.cpus)):
        c = st.cpus.get(cid)
        in_allowed = allowed is None or cid in allowed
        if c is None:
            cpus.append(
                Cpu(cid, st.package_of.get(cid, -1), -1, cpu_node.get(cid, -1), online=not in_allowed, allowed=False)
            )
        else:
            cpus.append(
                Cpu(cid, c.package, c.core, cpu_node.get(cid, -1), c.die, c.siblings, c.llc, allowed=in_allowed)
            )
    hidden = len(cpus) - len(st.cpus)
    if hidden:
        st.notes.append(f"{hidden} CPUs in complete_cpuset have no PU object (disallowed or offline)")
    dist = _numa_distances(root, node_ids)
    nodes = tuple(
        NumaNode(nid, st.nodes[nid][0], st.nodes[nid][1], dist.get(nid, ()), memory_only=not st.nodes[nid][0])
        for nid in node_ids
    )
    if not nodes:
        nodes = (NumaNode(id=0, cpus=tuple(c.id for c in cpus), memory_bytes=_attr_int(top, "local_memory", 0)),)
        cpus = [Cpu(**{**c.__dict__, "numa_node": 0}) for c in cpus]
        st.notes.append("no NUMANode objects: one node 0 with every CPU")
    nodeset_attr = top.get("allowed_nodeset")
    allowed_mems = tuple(n for n in parse_hwloc_set(nodeset_attr) if n in st.nodes) if nodeset_attr else ()
    gpus = pci_order(tuple(st.gpus))
    infos = _infos(top)
    return Topology(
        hostname=infos.get("HostName", ""),
        numa_nodes=nodes,
        cpus=tuple(cpus),
        gpus=tuple(Gpu(**{**g.__dict__, "index": i}) for i, g in enumerate(gpus)),
        nics=tuple(st.nics),
        allowed_mems=allowed_mems,
        source=f"hwloc:{origin}",
        gpu_source="hwloc" if gpus else "none",
        notes=tuple(st.notes),
    )


def _walk(el: ET.Element, ctx: _Ctx, st: _State, major: int) -> None:
    typ = el.get("type", "")
    if typ == "Package":
        ctx = _Ctx(**{**ctx.__dict__, "package": _attr_int(el, "os_index", -1)})
        for c in parse_hwloc_set(el.get("complete_cpuset") or el.get("cpuset") or "0x0"):
            st.package_of.setdefault(c, ctx.package)
    elif typ == "Die":
        ctx = _Ctx(**{**ctx.__dict__, "die": _attr_int(el, "os_index", 0)})
    elif typ == "Core":
        cs = parse_hwloc_set(el.get("complete_cpuset") or el.get("cpuset") or "0x0")
        ctx = _Ctx(**{**ctx.__dict__, "core": _attr_int(el, "os_index", -1), "core_cpus": cs})
    elif ctx.llc is None and _is_data_cache(el):
        cs = parse_hwloc_set(el.get("complete_cpuset") or el.get("cpuset") or "0x0")
        ctx = _Ctx(**{**ctx.__dict__, "llc": cs})
    elif typ == "NUMANode":
        nid = _attr_int(el, "os_index", -1)
        cs = parse_hwloc_set(el.get("complete_cpuset") or el.get("cpuset") or "0x0")
        st.nodes[nid] = (cs, _attr_int(el, "local_memory", 0), el.get("subtype", ""))
    elif typ == "PU":
        pid = _attr_int(el, "os_index", -1)
        if pid < 0:
            raise ValueError("PU without os_index")
        st.cpus[pid] = Cpu(
            id=pid,
            package=ctx.package,
            core=ctx.core if ctx.core is not None and ctx.core >= 0 else pid,
            die=ctx.die,
            siblings=ctx.core_cpus or (pid,),
            llc=min(ctx.llc) if ctx.llc else -1,
        )
    elif typ in ("Bridge", "PCIDev"):
        bus = el.get("pci_busid")
        if bus:
            ctx = _Ctx(**{**ctx.__dict__, "pci_chain": ctx.pci_chain + (normalize_bus_id(bus),)})
        if typ == "PCIDev":
            _pci_device(el, ctx, st, major)
    if typ not in _IO_TYPES and typ != "NUMANode" and el.get("cpuset") is not None:
        ctx = _Ctx(**{**ctx.__dict__, "locality": el})
    for child in el.findall("object"):
        _walk(child, ctx, st, major)


def _is_data_cache(el: ET.Element) -> bool:
    typ = el.get("type", "")
    if _CACHE_LEVEL.match(typ):
        return True
    if typ == "Cache":  # early hwloc 2.0 files: depth="3" cache_type="0|1"
        return el.get("cache_type", "0") in ("0", "1")
    return False


def _locality(ctx: _Ctx) -> tuple[int, tuple[int, ...]]:
    loc = ctx.locality
    if loc is None:
        return -1, ()
    nodes = parse_hwloc_set(loc.get("nodeset") or "0x0")
    cpus = parse_hwloc_set(loc.get("cpuset") or "0x0")
    return (nodes[0] if len(nodes) == 1 else -1), cpus


def _pci_device(el: ET.Element, ctx: _Ctx, st: _State, major: int) -> None:
    bus = normalize_bus_id(el.get("pci_busid", ""))
    numa, cpus = _locality(ctx)
    osdevs = [(o, _osdev_kind(o, major)) for o in el.findall("object") if o.get("type") == "OSDev"]
    m = _PCI_TYPE.match(el.get("pci_type", ""))
    if m:
        cls, vendor_id = int(m.group(1), 16), int(m.group(2), 16)
        vendor = gpu_vendor(vendor_id, cls)
        if vendor and not is_onboard_vga(vendor_id, int(m.group(3), 16)):
            name, uuid = "", ""
            for o, kind in osdevs:
                if kind != "gpu":
                    continue
                info = _infos(o)
                name = name or info.get("GPUModel", "")
                uuid = uuid or info.get("NVIDIAUUID", "") or info.get("AMDUUID", "")
            st.gpus.append(
                Gpu(
                    index=0,
                    pci_bus_id=bus,
                    numa_node=numa,
                    name=name or f"PCI {vendor_id:04x}:{m.group(3).lower()}",
                    uuid=uuid,
                    vendor=vendor,
                    cpu_affinity=cpus,
                    pci_path=ctx.pci_chain,
                )
            )
    ofed = [o for o, k in osdevs if k == "ofed"]
    nets = [o.get("name", "") for o, k in osdevs if k == "net"]
    for o in ofed:
        info = _infos(o)
        layers = [v for k, v in info.items() if re.fullmatch(r"Port\d+LinkLayer", k)]
        kind = NicKind.ROCE if layers and all(v == "Ethernet" for v in layers) else NicKind.INFINIBAND
        st.nics.append(
            Nic(
                name=o.get("name", ""),
                pci_bus_id=bus,
                numa_node=numa,
                kind=kind,
                netdevs=tuple(sorted(nets)),
                pci_path=ctx.pci_chain,
                ports=_rdma_ports(info),
            )
        )
    if not ofed:
        for n in nets:
            st.nics.append(
                Nic(name=n, pci_bus_id=bus, numa_node=numa, kind=NicKind.ETHERNET, netdevs=(n,), pci_path=ctx.pci_chain)
            )


def _rdma_ports(info: dict[str, str]) -> tuple[RdmaPort, ...]:
    """Ports from an OpenFabrics OSDev's ``Port<N>State`` and ``Port<N>LinkLayer`` infos (hwloc records no rate)."""
    numbers = sorted({int(m.group(1)) for k in info if (m := re.fullmatch(r"Port(\d+)(?:State|LinkLayer|LID)", k))})
    ports = []
    for n in numbers:
        state = info.get(f"Port{n}State", "").strip()
        ports.append(
            RdmaPort(
                number=n,
                state=PORT_STATES.get(int(state), "") if state.isdigit() else "",
                link_layer=info.get(f"Port{n}LinkLayer", "").strip(),
            )
        )
    return tuple(ports)


def _numa_distances(root: ET.Element, node_ids: list[int]) -> dict[int, tuple[int, ...]]:
    """NUMALatency rows aligned with ``node_ids``; {} unless every pair is known."""
    for d in root.findall("distances2"):
        if d.get("type") != "NUMANode" or d.get("name", "NUMALatency") != "NUMALatency":
            continue
        idx = [int(x) for i in d.findall("indexes") for x in (i.text or "").split()]
        vals = [int(x) for v in d.findall("u64values") for x in (v.text or "").split()]
        n = len(idx)
        if n * n != len(vals) or set(idx) != set(node_ids):
            return {}
        pos = {nid: k for k, nid in enumerate(idx)}
        return {a: tuple(vals[pos[a] * n + pos[b]] for b in node_ids) for a in node_ids}
    return {}
