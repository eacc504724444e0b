"""The PCI rules every topology reader shares: which function is a GPU, and the bus order (pure;
docs/design-notes.md)."""

from __future__ import annotations

from .model import Gpu, normalize_bus_id

GPU_VENDORS: dict[int, str] = {0x10DE: "nvidia", 0x1002: "amd"}
_GPU_CLASSES = frozenset({0x0300, 0x0302})
_AMD_EXTRA_CLASSES = frozenset({0x0380})
ONBOARD_VGA = frozenset({(0x1002, 0x515E), (0x1002, 0x5159)})  # ATI ES1000, RN50


def gpu_vendor(vendor_id: int | None, class_code: int) -> str | None:
    """``"nvidia"``/``"amd"`` when a function of this vendor and class (upper 16 bits: ``0x0302``) may be a GPU."""
    vendor = GPU_VENDORS.get(vendor_id or 0)
    if vendor is None:
        return None
    if class_code in _GPU_CLASSES or (vendor == "amd" and class_code in _AMD_EXTRA_CLASSES):
        return vendor
    return None


def is_onboard_vga(vendor_id: int | None, device_id: int | None) -> bool:
    return (vendor_id, device_id) in ONBOARD_VGA


def bus_sort_key(bus_id: str) -> tuple[int, int, int, int]:
    """``"0000:18:00.0"`` -> ``(0, 0x18, 0, 0)``."""
    dom, bus, rest = normalize_bus_id(bus_id).split(":")
    dev, fn = rest.split(".")
    return (int(dom, 16), int(bus, 16), int(dev, 16), int(fn))


def pci_order(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """GPUs in PCI bus order; by index when any bus id is unknown (nvidia-smi text)."""
    if gpus and all(g.pci_bus_id for g in gpus):
        return tuple(sorted(gpus, key=lambda g: bus_sort_key(g.pci_bus_id)))
    return tuple(sorted(gpus, key=lambda g: g.index))
