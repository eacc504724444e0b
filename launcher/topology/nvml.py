"""GPUs from NVML: one reader that records the driver's answers as a dict, then pure code (docs/design-notes.md)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TopologyError
from .model import Gpu, normalize_bus_id

log = logging.getLogger(__name__)

WORD_BITS = 64  # pynvml's c_ulonglong affinity arrays
CPU_WORDS = 64  # 4096 CPUs / NUMA nodes

NVML_LEVEL_CODES: dict[int, str] = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def level_code(level: Any) -> str:
    """One NVML topology level (int) -> its nvidia-smi code; ``""`` unknown."""
    if isinstance(level, bool) or not isinstance(level, int):
        return ""
    return NVML_LEVEL_CODES.get(level, "")


def nvml_to_smi_codes(
    levels: Sequence[Sequence[Any]], nvlink_counts: Sequence[Sequence[int]] | None = None
) -> tuple[tuple[str, ...], ...]:
    """Square matrices of NVML levels and NVLink counts -> nvidia-smi link codes (``NV<n>`` for n > 0 links)."""

    def code(i: int, j: int) -> str:
        count = nvlink_counts[i][j] if nvlink_counts else 0
        return "X" if i == j else f"NV{count}" if count > 0 else level_code(levels[i][j])

    return tuple(tuple(code(i, j) for j in range(len(levels))) for i in range(len(levels)))


def _ok(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and value.startswith("ERR"))


def _bits(words: Any) -> tuple[int, ...]:
    if not _ok(words) or not isinstance(words, list):
        return ()
    out: list[int] = []
    for w, word in enumerate(words):
        if isinstance(word, bool) or not isinstance(word, int) or word < 0:
            raise TopologyError(f"bad NVML affinity word {word!r}: expected a non-negative integer")
        out.extend(w * WORD_BITS + b for b in range(word.bit_length()) if word >> b & 1)
    return tuple(out)


def _gpu_list(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    gpus = record.get("gpus") if isinstance(record, Mapping) else None
    if not isinstance(gpus, list) or not all(isinstance(g, Mapping) for g in gpus):
        raise TopologyError(f"bad NVML record: 'gpus' is {type(gpus).__name__}, expected a list of objects")
    return gpus


NVLINK_DEVICE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
FABRIC_STATE_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
NVML_SUCCESS = 0


def fabric_of(raw: Any) -> tuple[str, int]:
    """A recorded ``nvmlDeviceGetGpuFabricInfo`` answer -> (cluster UUID, clique id), ("", -1) unless the GPU is
    registered in a multi-node NVLink fabric (state completed, status success, a cluster UUID that is not all zero)."""
    if not isinstance(raw, Mapping):
        return "", -1
    uuid, clique, state, status = raw.get("cluster_uuid"), raw.get("clique_id"), raw.get("state"), raw.get("status")
    if (
        state != FABRIC_STATE_COMPLETED
        or status != NVML_SUCCESS
        or not isinstance(uuid, str)
        or not isinstance(clique, int)
    ):
        return "", -1
    digits = uuid.replace("-", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits) or not digits.strip("0"):
        return "", -1
    text = f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
    return text, clique


def gpus_from_nvml_record(record: Mapping[str, Any]) -> tuple[Gpu, ...]:
    """Recorded NVML answers -> :class:`Gpu` models, in NVML index order."""
    out: list[Gpu] = []
    for pos, g in enumerate(_gpu_list(record)):
        try:
            index = int(g.get("index", pos))
            bus = normalize_bus_id(str(g["pci_bus_id"]))
        except (KeyError, ValueError) as e:
            raise TopologyError(
                f"bad NVML record for GPU {pos}: {e}; expected 'index' and 'pci_bus_id' such as '00000000:18:00.0'"
            ) from None
        mem_nodes = _bits(g.get("memory_affinity_words"))
        node = mem_nodes[0] if len(mem_nodes) == 1 else -1
        numa_id = g.get("numa_node_id")
        mem_node = (
            numa_id
            if isinstance(numa_id, int) and not isinstance(numa_id, bool) and numa_id >= 0 and numa_id != node
            else -1
        )
        total = g.get("memory_total")
        minor = g.get("minor_number")
        cluster, clique = fabric_of(g.get("fabric"))
        out.append(
            Gpu(
                index=index,
                pci_bus_id=bus,
                numa_node=node,
                name=str(g.get("name") or ""),
                uuid=str(g.get("uuid") or ""),
                cpu_affinity=_bits(g.get("cpu_affinity_words")),
                memory_numa_node=mem_node,
                memory_bytes=total if isinstance(total, int) and total > 0 else 0,
                minor=minor if isinstance(minor, int) and not isinstance(minor, bool) and minor >= 0 else -1,
                fabric_cluster=cluster,
                fabric_clique=clique,
            )
        )
    return tuple(out)


def links_from_nvml_record(record: Mapping[str, Any]) -> tuple[tuple[str, ...], ...]:
    """GPU x GPU link codes from NVLinks and common ancestors; ``""`` where NVML did not answer."""
    gpus = _gpu_list(record)
    bus_pos: dict[str, int] = {}
    for pos, g in enumerate(gpus):
        with contextlib.suppress(TopologyError):
            bus_pos[normalize_bus_id(str(g.get("pci_bus_id", "")))] = pos
    n = len(gpus)
    counts = [[0] * n for _ in range(n)]
    to_switch = [0] * n  # active links whose far end is an NVSwitch
    levels = [[(g.get("common_ancestor") or {}).get(str(j)) for j in range(n)] for g in gpus]
    for i, g in enumerate(gpus):
        for link in g.get("nvlinks") or []:
            if not isinstance(link, list) or len(link) < 3 or link[1] not in (1, True):
                continue
            if len(link) > 3 and link[3] == NVLINK_DEVICE_SWITCH:
                to_switch[i] += 1
                continue
            try:
                j = bus_pos.get(normalize_bus_id(str(link[2])))
            except TopologyError:
                continue
            if j is not None and j != i:
                counts[i][j] += 1
    # GPUs on the node's NVSwitches reach each other over as many links as the one with fewer has (nvidia-smi's NV18)
    for i in range(n):
        for j in range(n):
            if i != j and not counts[i][j] and to_switch[i] and to_switch[j]:
                counts[i][j] = min(to_switch[i], to_switch[j])
    return nvml_to_smi_codes(levels, counts)


@dataclass(frozen=True)
class NvmlReading:
    """What NVML said about this node's GPUs."""

    driver_version: str
    nvml_version: str
    gpus: tuple[Gpu, ...]  # NVML index order (= PCI bus order)
    gpu_links: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()


def reading_from_record(record: Mapping[str, Any]) -> NvmlReading:
    """Pure: a recorded NVML dict -> :class:`NvmlReading`, with notes on what was unknown."""
    gpus = gpus_from_nvml_record(record)
    notes: list[str] = []
    for g, raw in zip(gpus, _gpu_list(record)):
        if not _ok(raw.get("numa_node_id")):
            notes.append(f"NVML GPU {g.index}: nvmlDeviceGetNumaNodeId not answered; NUMA node from memory affinity")
        if g.numa_node < 0:
            notes.append(f"NVML GPU {g.index}: memory affinity names no single NUMA node; numa_node -1")
        if not g.cpu_affinity:
            notes.append(f"NVML GPU {g.index}: empty CPU affinity")
    links = links_from_nvml_record(record)
    if len(gpus) > 1 and any(c == "" for row in links for c in row):
        notes.append("NVML did not give the link level of some GPU pairs")
    return NvmlReading(str(record.get("driver", "")), str(record.get("nvml_version", "")), gpus, links, tuple(notes))


def _call(fn: Any, *args: Any) -> Any:
    """One NVML call; its error becomes ``"ERR <message>"`` so that the others still run."""
    try:
        value = fn(*args)
    except Exception as e:  # pynvml raises NVMLError subclasses per return code
        return f"ERR {type(e).__name__}: {e}"
    return value.decode() if isinstance(value, bytes) else value


def nvml_open(without: str) -> Any:
    """pynvml, initialised; None without pynvml or an NVIDIA driver (``without``: what is then not read)."""
    try:
        import pynvml  # optional

        pynvml.nvmlInit()
    except ImportError:
        log.debug("pynvml not installed: %s", without)
        return None
    except Exception as e:
        log.debug("NVML unavailable (%s): %s", e, without)
        return None
    return pynvml


def nvml_close(pynvml: Any) -> None:
    with contextlib.suppress(Exception):
        pynvml.nvmlShutdown()


def read_nvml_record(answers: Callable[[Any, Any], Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """Ask NVML about every GPU; None when pynvml or the driver is missing. ``answers(pynvml, handle)``: more
    answers to record beside each GPU's."""
    pynvml = nvml_open("no NVML GPU discovery")
    if pynvml is None:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus: list[dict[str, Any]] = []
        for i, h in enumerate(handles):
            pci = _call(pynvml.nvmlDeviceGetPciInfo, h)
            mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
            gpus.append(
                {
                    "index": i,
                    "name": _call(pynvml.nvmlDeviceGetName, h),
                    "uuid": _call(pynvml.nvmlDeviceGetUUID, h),
                    "pci_bus_id": _bus_text(pci),
                    "memory_total": mem if isinstance(mem, str) else int(mem.total),
                    "cpu_affinity_words": _words(_call(pynvml.nvmlDeviceGetCpuAffinity, h, CPU_WORDS)),
                    "memory_affinity_words": _words(
                        _call(pynvml.nvmlDeviceGetMemoryAffinity, h, CPU_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE)
                    ),
                    "numa_node_id": _call(pynvml.nvmlDeviceGetNumaNodeId, h),
                    "minor_number": _call(pynvml.nvmlDeviceGetMinorNumber, h),
                    "nvlinks": _nvlinks(pynvml, h),
                    "fabric": _fabric(pynvml, h),
                    "common_ancestor": {
                        str(j): _call(pynvml.nvmlDeviceGetTopologyCommonAncestor, h, other)
                        for j, other in enumerate(handles)
                        if j != i
                    },
                    **(answers(pynvml, h) if answers else {}),
                }
            )
        return {
            "driver": _call(pynvml.nvmlSystemGetDriverVersion),
            "nvml_version": _call(pynvml.nvmlSystemGetNVMLVersion),
            "gpus": gpus,
        }
    except Exception as e:
        log.debug("NVML reading failed (%s): no NVML GPU discovery", e)
        return None
    finally:
        nvml_close(pynvml)


def _bus_text(pci: Any) -> str:
    if isinstance(pci, str):
        return pci
    bus = pci.busId
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def _words(value: Any) -> Any:
    """ctypes array -> list of ints, trailing zero words dropped; errors pass through."""
    if isinstance(value, str):
        return value
    words = [int(w) for w in value]
    while len(words) > 1 and words[-1] == 0:
        words.pop()
    return words


def _fabric(pynvml: Any, handle: Any) -> Any:
    """``nvmlDeviceGetGpuFabricInfo(V)``: the GPU's multi-node NVLink fabric (cluster UUID, clique id, state,
    status) as a dict, or ``"ERR ..."`` (drivers before R530, GPUs without a fabric: NotSupported)."""
    import ctypes

    versioned = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
    if versioned is not None and hasattr(pynvml, "nvmlDeviceGetGpuFabricInfoV"):
        info, call = versioned(), pynvml.nvmlDeviceGetGpuFabricInfoV
    elif hasattr(pynvml, "c_nvmlGpuFabricInfo_t"):
        info, call = pynvml.c_nvmlGpuFabricInfo_t(), pynvml.nvmlDeviceGetGpuFabricInfo
    else:
        return "ERR pynvml without GPU fabric info"
    answer = _call(call, handle, ctypes.byref(info))
    if isinstance(answer, str):
        return answer
    return {
        "cluster_uuid": bytes(info.clusterUuid).hex(),
        "clique_id": int(info.cliqueId),
        "state": int(info.state),
        "status": int(info.status),
    }


def _nvlinks(pynvml: Any, handle: Any) -> list[list[Any]]:
    out: list[list[Any]] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = _call(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        if isinstance(state, str):  # NotSupported on link 0: no NVLink at all
            out.append([link, state])
            if link == 0:
                break
            continue
        remote = _call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link) if state else "ERR inactive"
        kind = (
            _call(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            if state and hasattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType")
            else "ERR inactive"
        )
        # [link, active, far end's bus id, far end's device type (0 GPU, 2 NVSwitch)]
        out.append([link, int(state), remote if isinstance(remote, str) else _bus_text(remote), kind])
    return out


def read_nvml_gpus() -> NvmlReading | None:
    """The live NVML reading, or None without pynvml or an NVIDIA driver."""
    record = read_nvml_record()
    return None if record is None else reading_from_record(record)
