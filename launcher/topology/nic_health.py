"""A NIC's link and counters from sysfs, below ``root`` (a recorded tree in tests): its speed and state, and the
counters that say a link is congested or failing (docs/design-notes.md, "NIC counters (`topology/nic_health.py`)").

* An RDMA device's port (InfiniBand or RoCE), ``sys/class/infiniband/<dev>/ports/<N>/``
  (Documentation/ABI/stable/sysfs-class-infiniband): ``state`` (``4: ACTIVE``), ``rate`` (``200 Gb/sec (4X HDR)``)
  and ``counters/``: the ticks it had data to send but could not (``port_xmit_wait``: no credits from the far end,
  the fabric's congestion), the physical layer's errors (``symbol_error``, ``link_error_recovery``,
  ``link_downed``, ``local_link_integrity_errors``), bad packets received (``port_rcv_errors``,
  ``port_rcv_remote_physical_errors``, ``excessive_buffer_overrun_errors``), packets it discarded
  (``port_xmit_discards``) and its data (``port_xmit_data``, ``port_rcv_data``: octets divided by 4, the IBA's
  PortCounters unit).
* A plain interface, ``sys/class/net/<if>/`` (Documentation/ABI/testing/sysfs-class-net and
  sysfs-class-net-statistics): ``speed`` (Mb/s; -1 or EINVAL while the link is down), ``operstate`` and
  ``statistics/{rx,tx}_{dropped,errors,bytes}``.

Counters are cumulative (since the driver loaded, or since someone cleared them): what matters is how far they
moved while a job ran, which the step report's sampler computes from two readings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TopologyError
from .fileio import read_bounded
from .model import RdmaPort

LINK_ERRORS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "local_link_integrity_errors",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
"""An RDMA port's error counters: any rise is a fault of the link."""
DROPS = ("rx_dropped", "tx_dropped", "rx_errors", "tx_errors")
"""A plain interface's drop and error counters."""
IB_COUNTERS = ("port_xmit_wait", *LINK_ERRORS, "port_xmit_data", "port_rcv_data")
NET_COUNTERS = (*DROPS, "rx_bytes", "tx_bytes")
IB_WORD = 4
"""``port_xmit_data`` / ``port_rcv_data`` count 4-octet words."""

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(?:\d+\s*:\s*)?([A-Za-z_]+)\s*$")


@dataclass(frozen=True)
class NicReading:
    """One NIC's link and counters at one moment."""

    name: str
    port: int = 0
    """The RDMA port read; 0 for a plain interface."""
    rdma: bool = False
    up: bool | None = None
    """Its port ACTIVE (an interface ``up``); None unknown."""
    rate_gbps: float = 0.0
    """Its link's speed; 0 unknown (or down)."""
    counters: dict[str, int] = field(default_factory=dict)
    """The counters sysfs answered (:data:`IB_COUNTERS` or :data:`NET_COUNTERS`)."""

    def sent_received(self) -> tuple[int, int] | None:
        """Bytes sent and received so far; None when sysfs does not count them."""
        (sent, received), scale = (
            (("port_xmit_data", "port_rcv_data"), IB_WORD) if self.rdma else (("tx_bytes", "rx_bytes"), 1)
        )
        if sent not in self.counters or received not in self.counters:
            return None
        return self.counters[sent] * scale, self.counters[received] * scale


def _text(path: Path) -> str | None:
    try:
        return read_bounded(path, limit=4096).decode(errors="replace")
    except (OSError, TopologyError):  # absent, a link down (EINVAL), or not a file a recorded tree should hold
        return None


def _count(path: Path) -> int | None:
    text = (_text(path) or "").strip()
    return int(text) if text.isdigit() else None


def read_rdma_port(root: Path, device: str, port: int = 0) -> NicReading | None:
    """``device``'s port ``port`` (0: its first port); None when sysfs has no such device or port."""
    ports = root / "sys" / "class" / "infiniband" / device / "ports"
    if port <= 0:
        try:
            port = min((int(p.name) for p in ports.iterdir() if p.name.isdigit()), default=0)  # 0: none, no directory
        except OSError:
            return None
    base = ports / str(port)
    if not base.is_dir():
        return None
    state = _STATE.match(_text(base / "state") or "")
    rate = _RATE.match(_text(base / "rate") or "")
    counters = {k: v for k in IB_COUNTERS if (v := _count(base / "counters" / k)) is not None}
    return NicReading(
        name=device,
        port=port,
        rdma=True,
        up=RdmaPort(port, state.group(1) if state else "").active,  # the doctor's reading of a port's state
        rate_gbps=float(rate.group(1)) if rate else 0.0,
        counters=counters,
    )


def read_interface(root: Path, name: str) -> NicReading | None:
    """The network interface ``name``; None when sysfs has none of that name."""
    base = root / "sys" / "class" / "net" / name
    if not base.is_dir():
        return None
    speed = (_text(base / "speed") or "").strip()
    state = (_text(base / "operstate") or "").strip().lower()
    counters = {k: v for k in NET_COUNTERS if (v := _count(base / "statistics" / k)) is not None}
    return NicReading(
        name=name,
        up={"up": True, "down": False, "lowerlayerdown": False}.get(state),
        rate_gbps=int(speed) / 1000 if speed.isdigit() else 0.0,
        counters=counters,
    )


def read_nic(root: Path, name: str, port: int = 0) -> NicReading | None:
    """A NIC as the plan names it: an RDMA device (``mlx5_0``, its port ``port``) or an interface (``eth0``)."""
    rdma = (root / "sys" / "class" / "infiniband" / name).is_dir()
    return read_rdma_port(root, name, port) if rdma else read_interface(root, name)
