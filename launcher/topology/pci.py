"""The PCI rules every topology reader shares: which PCI function is a GPU, and the PCI bus order. Pure.

GPUs (``Documentation/ABI/testing/sysfs-bus-pci``; class codes from the PCI Code and ID
Assignment Specification):

- vendor 0x10de (NVIDIA) or 0x1002 (AMD), and class 0x0300 (VGA) or 0x0302 (3D controller);
  AMD Instinct cards report 0x0380 ("other display"), accepted for AMD only;
- on-board server VGA chips are not GPUs: ASPEED (0x1a03) and Matrox (0x102b) have other
  vendor ids, ATI ES1000/RN50 carry AMD's and are listed in :data:`ONBOARD_VGA`.

The bus order is NVML's, and CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: domain, bus, device,
function, compared as numbers.
"""

from __future__ import annotations

from .model import Gpu, normalize_bus_id

GPU_VENDORS: dict[int, str] = {0x10DE: "nvidia", 0x1002: "amd"}
"""PCI vendor id -> the ``Gpu.vendor`` it gives."""
_GPU_CLASSES = frozenset({0x0300, 0x0302})
_AMD_EXTRA_CLASSES = frozenset({0x0380})
ONBOARD_VGA = frozenset({(0x1002, 0x515E), (0x1002, 0x5159)})
"""(vendor, device) of on-board server VGA chips with a GPU vendor's id: ATI ES1000 and RN50."""


def gpu_vendor(vendor_id: int | None, class_code: int) -> str | None:
    """``"nvidia"``/``"amd"`` when a function of this vendor and class may be a GPU, else None.

    ``class_code`` is the upper 16 bits of the 24-bit class (``0x0302`` of sysfs' ``0x030200``).
    A candidate is a GPU unless :func:`is_onboard_vga` says otherwise (readers check that
    second so that a device id is read only for candidates).
    """
    vendor = GPU_VENDORS.get(vendor_id or 0)
    if vendor is None:
        return None
    if class_code in _GPU_CLASSES or (vendor == "amd" and class_code in _AMD_EXTRA_CLASSES):
        return vendor
    return None


def is_onboard_vga(vendor_id: int | None, device_id: int | None) -> bool:
    """True for an on-board server VGA chip that carries a GPU vendor's id (not a compute GPU)."""
    return (vendor_id, device_id) in ONBOARD_VGA


def bus_sort_key(bus_id: str) -> tuple[int, int, int, int]:
    """``"0000:18:00.0"`` -> ``(0, 0x18, 0, 0)``: PCI bus order as numbers (any accepted bus id form)."""
    dom, bus, rest = normalize_bus_id(bus_id).split(":")
    dev, fn = rest.split(".")
    return (int(dom, 16), int(bus, 16), int(dev, 16), int(fn))


def pci_order(gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """GPUs in PCI bus order (NVML's order); by index when any bus id is unknown (nvidia-smi text)."""
    if gpus and all(g.pci_bus_id for g in gpus):
        return tuple(sorted(gpus, key=lambda g: bus_sort_key(g.pci_bus_id)))
    return tuple(sorted(gpus, key=lambda g: g.index))
