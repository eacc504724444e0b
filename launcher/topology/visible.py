"""Which GPUs a worker sees, in the order CUDA numbers them (pure); why stricter than CUDA: docs/design-notes.md."""

from __future__ import annotations

import logging

from ..argtypes import ascii_digits
from ..errors import VisibleDevicesError
from .model import Gpu, Topology
from .pci import pci_order

log = logging.getLogger(__name__)

PCI_BUS_ID = "PCI_BUS_ID"
_FORM = "a comma-separated list of GPU indices or GPU UUIDs such as '0,2' or 'GPU-381924f5,GPU-8932f937'"


def openable(gpus: tuple[Gpu, ...], minors: frozenset[int] | tuple[int, ...] | None) -> tuple[Gpu, ...]:
    """The GPUs a process whose device cgroup lets it open only ``minors`` (``/dev/nvidia<minor>``) can use (None:
    all)."""
    if minors is None:
        return gpus
    known = all(g.minor >= 0 for g in gpus)
    if not known:
        log.warning(
            "this topology source records no GPU minor numbers: taking GPU index N as /dev/nvidiaN for the scheduler's "
            "GPUs %s (a live machine, or a recorded tree with /proc/driver/nvidia/gpus/*/information, knows them)",
            ",".join(str(m) for m in sorted(minors)),
        )
    number = {id(g): (g.minor if known else g.index) for g in gpus}
    missing = set(minors) - set(number.values())
    if missing:
        raise VisibleDevicesError(
            f"bad GPU selection: the scheduler gave this task GPU minor number(s) {sorted(missing)}, which this "
            "topology "
            f"does not have (its minors: {sorted(number.values())}); expected the node's own topology"
        )
    return tuple(g for g in gpus if number[id(g)] in minors)


def visible_gpus(
    topology: Topology,
    cuda_visible_devices: str | None,
    cuda_device_order: str | None,
    allowed_minors: frozenset[int] | tuple[int, ...] | None = None,
) -> tuple[Gpu, ...]:
    """GPUs of ``topology`` as CUDA device 0, 1, ... of a process with this environment.

    Unset -> all, ``""``/``"-1"`` -> none; indices count among ``allowed_minors`` (see :func:`openable`).
    Raises :class:`VisibleDevicesError` for anything CUDA would truncate or reject.
    """
    gpus = pci_order(openable(tuple(topology.gpus), allowed_minors))
    if (cuda_device_order or "").strip() != PCI_BUS_ID and len({g.name for g in gpus}) > 1:
        log.warning(
            "CUDA_DEVICE_ORDER is %r, not PCI_BUS_ID, and the GPUs differ (%s): CUDA's default "
            "FASTEST_FIRST order may then differ from NVML's PCI bus order used here; numarun sets "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID for its workers",
            cuda_device_order,
            ", ".join(sorted({g.name or "?" for g in gpus})),
        )
    if cuda_visible_devices is None:
        return gpus
    text = cuda_visible_devices.strip()
    if text in ("", "-1"):
        return ()
    if not gpus:
        # as torchrun: the variable names devices CUDA will not find, and the ranks run on CPUs
        log.warning(
            "CUDA_VISIBLE_DEVICES=%r names GPUs, but this machine has none: running CPU-only ranks",
            cuda_visible_devices,
        )
        return ()
    chosen: list[Gpu] = []
    for raw in text.split(","):
        entry = raw.strip()
        gpu = _resolve(entry, gpus, cuda_visible_devices)
        if any(g is gpu for g in chosen):
            raise VisibleDevicesError(
                f"bad CUDA_VISIBLE_DEVICES {cuda_visible_devices!r}: {entry!r} names GPU {gpu.index} again; "
                f"expected each GPU at most once, as {_FORM}"
            )
        chosen.append(gpu)
    return tuple(chosen)


def _resolve(entry: str, gpus: tuple[Gpu, ...], whole: str) -> Gpu:
    bad = f"bad CUDA_VISIBLE_DEVICES {whole!r}: entry {entry!r}"
    # "MIG-<uuid>" (R470+) or the older "MIG-GPU-<uuid>/<gi>/<ci>".
    if entry.upper().startswith("MIG-") or "/" in entry:
        raise VisibleDevicesError(
            f"{bad} is a MIG instance; MIG instances are not supported for binding, expected GPU indices or GPU UUIDs "
            f"({_FORM})"
        )
    if ascii_digits(entry.removeprefix("-")):
        i = int(entry)
        if not 0 <= i < len(gpus):
            valid = f"0-{len(gpus) - 1}" if gpus else "none: this topology has no GPUs"
            raise VisibleDevicesError(f"{bad} is out of range; valid GPU indices are {valid} ({_FORM})")
        return gpus[i]
    if entry.upper().startswith("GPU-") and len(entry) > 4:
        known = [g for g in gpus if g.uuid]
        if not known:
            raise VisibleDevicesError(
                f"{bad} is a UUID, but this topology source has no GPU UUIDs; expected GPU indices 0-{len(gpus) - 1}"
            )
        want = entry.lower()
        hits = [g for g in known if g.uuid.lower().startswith(want)]
        if len(hits) == 1:
            return hits[0]
        why = "matches several GPUs" if hits else "matches no GPU"
        raise VisibleDevicesError(f"{bad} {why}; the GPU UUIDs are {', '.join(g.uuid for g in known)} ({_FORM})")
    raise VisibleDevicesError(f"{bad} is neither a GPU index nor a GPU UUID; expected {_FORM}")
