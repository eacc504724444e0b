"""``nvidia-smi topo -m`` text -> :class:`SmiMatrix` -> :class:`Topology` (pure; forms and inferences:
docs/design-notes.md)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..cpuset import format_list, parse_list, runs
from ..errors import CpuListError, TopologyError
from .model import Cpu, Gpu, Nic, NicKind, NumaNode, Topology

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CODE = re.compile(r"X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+")
_LABEL = re.compile(r"GPU\d+|NIC\d+")
_GPU_LABEL = re.compile(r"GPU(\d+)")
_NIC_LABEL = re.compile(r"NIC(\d+)")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_FORM = (
    "the output of 'nvidia-smi topo -m': a header 'GPU0 GPU1 ... [NIC0 ...] CPU Affinity "
    "[NUMA Affinity] [GPU NUMA ID]', one row per device with link codes "
    "X/NV<n>/PIX/PXB/PHB/NODE/SYS, then an optional 'NIC Legend:' block"
)


@dataclass(frozen=True)
class SmiMatrix:
    """One ``nvidia-smi topo -m`` matrix, as printed (codes normalised: ``SOC`` -> ``SYS``)."""

    origin: str
    gpus: tuple[str, ...]  # column titles GPU0, GPU1...
    nics: tuple[str, ...]  # NIC0... (new format) or mlx5_0... (old)
    nic_names: tuple[str, ...]  # from the NIC Legend, else the column title
    gpu_links: tuple[tuple[str, ...], ...]
    nic_links: tuple[tuple[str, ...], ...]  # GPU rows x NIC columns
    cpu_affinity: tuple[tuple[int, ...], ...]  # per GPU; N/A -> ()
    numa_affinity: tuple[tuple[int, ...], ...]  # per GPU; N/A or absent -> ()
    gpu_numa_id: tuple[int, ...]  # per GPU; -1 for N/A or absent
    columns: tuple[str, ...] = _AFFINITY_COLUMNS  # the affinity columns the file had


def _fail(origin: str, lineno: int, problem: str, line: str | None = None) -> TopologyError:
    where = f"{origin!r} line {lineno}" if lineno else repr(origin)
    shown = f" {line.strip()[:80]!r}" if line is not None else ""
    return TopologyError(f"bad nvidia-smi topology {where}: {problem}{shown}; expected {_FORM}")


def _split(pattern: re.Pattern[str], token: str) -> list[str] | None:
    """``"NODENODE"`` -> ``["NODE", "NODE"]`` (link codes; ``"GPU0GPU1"`` for labels); None when ``token`` is not
    made of ``pattern``'s matches."""
    parts = pattern.findall(token)
    return parts if parts and "".join(parts) == token else None


def _header_tokens(line: str) -> list[str]:
    for i, title in enumerate(_AFFINITY_COLUMNS):
        line = line.replace(title, f"\x00{i}")
    out: list[str] = []
    for tok in line.split():
        if tok.startswith("\x00"):
            out.append(_AFFINITY_COLUMNS[int(tok[1:])])
        else:
            out.extend(_split(_LABEL, tok) or [tok])
    return out


def _check_text(text: str, origin: str) -> list[str]:
    if not isinstance(text, str):
        raise TopologyError(f"bad nvidia-smi topology {origin!r}: got {type(text).__name__}, expected text; {_FORM}")
    lines = _ANSI.sub("", text).lstrip("\ufeff").replace("\r\n", "\n").split("\n")
    for n, line in enumerate(lines, 1):
        if any((ord(ch) < 32 and ch not in "\t") or ch in "\x7f\ufffd" for ch in line):
            raise _fail(origin, n, "binary or control characters in", line.encode("unicode_escape").decode()[:80])
    return lines


def parse_topo_m(text: str, origin: str) -> SmiMatrix:
    """Parse the text of ``nvidia-smi topo -m``. ``origin`` names the file in errors."""
    lines = _check_text(text, origin)
    n = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if n == len(lines):
        raise _fail(origin, 0, "the text is empty")
    header_no = n + 1
    tokens = _header_tokens(lines[n])
    devices: list[str] = []
    columns: list[str] = []
    for tok in tokens:
        if tok in _AFFINITY_COLUMNS:
            columns.append(tok)
        elif columns:
            raise _fail(origin, header_no, f"column {tok!r} after the affinity columns in the header", lines[n])
        else:
            devices.append(tok)
    gpus = [d for d in devices if _GPU_LABEL.fullmatch(d)]
    if not gpus or devices[: len(gpus)] != [f"GPU{i}" for i in range(len(gpus))]:
        raise _fail(origin, header_no, "the header does not start with GPU0, GPU1, ...", lines[n])
    if "CPU Affinity" not in columns or tuple(columns) != tuple(c for c in _AFFINITY_COLUMNS if c in columns):
        raise _fail(origin, header_no, "the header lacks 'CPU Affinity' or has its columns out of order", lines[n])
    nics = devices[len(gpus) :]
    for d in nics:
        if _GPU_LABEL.fullmatch(d) or not re.fullmatch(r"[A-Za-z][\w.\-]*", d):
            raise _fail(origin, header_no, f"bad device column {d!r} in the header", lines[n])
    if len(set(devices)) != len(devices):
        raise _fail(origin, header_no, "a device column appears twice in the header", lines[n])

    ndev = len(devices)
    links: list[list[str]] = []
    gpu_cols: list[list[str]] = []
    n += 1
    for row_i, label in enumerate(devices):
        if n >= len(lines) or not lines[n].strip():
            raise _fail(
                origin, n + 1 if n < len(lines) else 0, f"the matrix ends before the row of {label} (file truncated?)"
            )
        line = lines[n]
        toks = line.split()
        if toks[0] != label:
            raise _fail(origin, n + 1, f"expected the row of {label}, got", line)
        cells: list[str] = []
        rest = toks[1:]
        while rest and len(cells) < ndev:
            tok = rest.pop(0)
            parts = _split(_CODE, tok)
            if parts is None:
                if re.fullmatch(r"[A-Za-z]+\d*", tok):
                    raise _fail(origin, n + 1, f"bad link code {tok!r} in", line)
                raise _fail(origin, n + 1, f"{len(cells)} link cells for {ndev} devices in", line)
            cells.extend(parts)
        if len(cells) != ndev:
            raise _fail(origin, n + 1, f"{len(cells)} link cells for {ndev} devices in", line)
        if cells[row_i] != "X":
            raise _fail(
                origin, n + 1, f"cell {row_i} of row {label} is {cells[row_i]!r}, not 'X' (columns misaligned)", line
            )
        links.append(["SYS" if c == "SOC" else c for c in cells])
        if row_i < len(gpus):
            if len(rest) != len(columns):
                raise _fail(
                    origin, n + 1, f"{len(rest)} affinity values for the {len(columns)} columns {columns} in", line
                )
            gpu_cols.append(rest)
        elif rest:
            raise _fail(origin, n + 1, f"unexpected values {rest} after the link cells of {label}", line)
        n += 1

    legend = {m.group(1): m.group(2) for line in lines[n:] if (m := _LEGEND_ENTRY.match(line))}
    nic_names = tuple(legend.get(col, col) for col in nics)

    ng = len(gpus)
    cpu_aff: list[tuple[int, ...]] = []
    numa_aff: list[tuple[int, ...]] = []
    gpu_numa: list[int] = []
    for g, vals in enumerate(gpu_cols):
        row = dict(zip(columns, vals))
        lineno = header_no + 1 + g
        cpu_aff.append(_ids(row["CPU Affinity"], origin, lineno, "CPU Affinity"))
        numa_aff.append(_ids(row.get("NUMA Affinity", "N/A"), origin, lineno, "NUMA Affinity"))
        raw = row.get("GPU NUMA ID", "N/A")
        if raw == "N/A":
            gpu_numa.append(-1)
        elif raw.isdigit():
            gpu_numa.append(int(raw))
        else:
            raise _fail(origin, lineno, f"bad GPU NUMA ID {raw!r} (expected a node id or N/A) in", lines[lineno - 1])
    return SmiMatrix(
        origin,
        tuple(gpus),
        tuple(nics),
        nic_names,
        tuple(tuple(r[:ng]) for r in links[:ng]),
        tuple(tuple(r[ng:]) for r in links[:ng]),
        tuple(cpu_aff),
        tuple(numa_aff),
        tuple(gpu_numa),
        tuple(columns),
    )


def _ids(value: str, origin: str, lineno: int, column: str) -> tuple[int, ...]:
    if value == "N/A":
        return ()
    try:
        return parse_list(value, column)
    except CpuListError:
        raise _fail(origin, lineno, f"bad {column} {value!r} (expected a list such as '0-23,48-71' or N/A)") from None


def nic_kind(name: str) -> NicKind:
    """Guess a NIC's link layer from its RDMA device name (nvidia-smi does not say)."""
    low = name.lower()
    if "eth" in low or "bond" in low:
        return NicKind.ROCE
    if low.startswith(("mlx", "ib", "qib", "hfi")):
        return NicKind.INFINIBAND
    return NicKind.OTHER


_NEAR = ("PIX", "PXB", "PHB", "NODE")


def _smt_offset(node_cpus: dict[int, tuple[int, ...]], total: int) -> int:
    """The SMT sibling offset k = ceil(total/2) when every multi-range node looks like ``a-b,(a+k)-(b'+k)``, else 0."""
    half = (total + 1) // 2
    found = False
    for cpus in node_cpus.values():
        ranges = runs(cpus)
        if len(ranges) == 1:
            continue
        if len(ranges) != 2:
            return 0
        (a, b), (c, d) = ranges
        if c - a != half or c <= b or d - c > b - a:
            return 0
        found = True
    return half if found else 0


def topology_from_smi(text: str, origin: str) -> Topology:
    """A full :class:`Topology` from ``nvidia-smi topo -m`` text; every inference is written to ``notes``."""
    mx = parse_topo_m(text, origin)
    notes: list[str] = ["nvidia-smi text has no PCI bus ids: GPUs are matched by index only"]
    if re.search(r"(?<![\w])SOC(?![\w])", _ANSI.sub("", text)):
        notes.append("old link code SOC read as SYS")
    ng = len(mx.gpus)
    unnamed = [col for col, name in zip(mx.nics, mx.nic_names) if _NIC_LABEL.fullmatch(name)]
    if unnamed:
        notes.append(f"no 'NIC Legend' entry for {', '.join(unnamed)}: device names unknown, kept as column titles")

    node_cpus: dict[int, set[int]] = {}
    gpu_nodes: list[int] = []
    for g in range(ng):
        aff = mx.numa_affinity[g]
        if len(aff) == 1:
            gpu_nodes.append(aff[0])
            node_cpus.setdefault(aff[0], set()).update(mx.cpu_affinity[g])
        else:
            gpu_nodes.append(-1)
            for nid in aff:
                node_cpus.setdefault(nid, set())
            if len(aff) > 1:
                notes.append(f"GPU{g} has NUMA affinity {format_list(aff)} (several nodes): its numa_node is -1")
    all_cpus = sorted(set().union(*mx.cpu_affinity)) if ng else []
    if not any(mx.numa_affinity):
        node_cpus = {0: set(all_cpus)}
        notes.append("no NUMA affinity in the matrix: all CPUs named are assumed to be on NUMA node 0")
    else:
        known = set().union(*node_cpus.values())
        stray = [c for c in all_cpus if c not in known]
        if stray:
            notes.append(
                f"CPUs {format_list(stray)} have no known NUMA node (their GPU's NUMA affinity is not one node)"
            )
    notes.append(
        "NUMA node CPUs come from the GPUs' CPU affinity; nodes without a GPU are not visible; memory sizes unknown"
    )

    mem_only: list[int] = []
    for g in range(ng):
        nid = mx.gpu_numa_id[g]
        if nid >= 0 and nid not in node_cpus:
            node_cpus[nid] = set()
            mem_only.append(nid)
    if mem_only:
        notes.append(f"GPU NUMA ID {format_list(mem_only)}: memory-only node(s) holding GPU memory")

    total = (max(all_cpus) + 1) if all_cpus else 0
    frozen_nodes = {k: tuple(sorted(v)) for k, v in node_cpus.items()}
    offset = _smt_offset({k: v for k, v in frozen_nodes.items() if v}, total)
    if offset:
        notes.append(f"SMT siblings inferred as CPU c and c+{offset} (each node's CPU affinity has that shape)")
    elif all_cpus:
        notes.append("SMT siblings unknown (no node's CPU affinity has the 'a-b,(a+N/2)-(b+N/2)' shape)")
    notes.append("package = NUMA node (nvidia-smi does not show sockets); last-level cache unknown")

    cpu_node = {c: nid for nid, cpus in frozen_nodes.items() for c in cpus}
    cpus: list[Cpu] = []
    for c in all_cpus:
        nid = cpu_node.get(c, -1)
        sib: tuple[int, ...] = ()
        if offset:
            pair = c + offset if c < offset else c - offset
            same = pair in cpu_node and cpu_node.get(pair) == nid
            sib = tuple(sorted((c, pair))) if same else (c,)
        core = sib[0] if sib else c
        cpus.append(Cpu(id=c, package=max(nid, 0), core=core, numa_node=nid, siblings=sib))

    numa_nodes = tuple(
        NumaNode(id=nid, cpus=frozen_nodes[nid], memory_bytes=0, memory_only=not frozen_nodes[nid])
        for nid in sorted(frozen_nodes)
    )
    gpus = tuple(
        Gpu(
            index=g,
            pci_bus_id="",
            numa_node=gpu_nodes[g],
            cpu_affinity=mx.cpu_affinity[g],
            memory_numa_node=mx.gpu_numa_id[g],
        )
        for g in range(ng)
    )
    nics: list[Nic] = []
    for k, name in enumerate(mx.nic_names):
        near = {gpu_nodes[g] for g in range(ng) if mx.nic_links[g][k] in _NEAR}
        node = near.pop() if len(near) == 1 else -1
        if node < 0:
            notes.append(
                f"NIC {name}: NUMA node unknown (no GPU on a known node is PIX/PXB/PHB/NODE to it, or they disagree)"
            )
        nics.append(Nic(name=name, numa_node=node, kind=nic_kind(name)))
    if nics:
        notes.append("NIC NUMA nodes inferred from the GPUs they are PIX/PXB/PHB/NODE to; NIC kinds guessed from names")
    return Topology(
        hostname="",
        numa_nodes=numa_nodes,
        cpus=tuple(cpus),
        gpus=gpus,
        nics=tuple(nics),
        gpu_links=mx.gpu_links,
        nic_links=mx.nic_links if nics else (),
        source=f"nvidia-smi:{origin}",
        gpu_source="nvidia-smi",
        notes=tuple(notes),
    )
