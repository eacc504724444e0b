"""The one-node checks: a Topology plus probe answers -> findings. Pure: no I/O here.

Each ``check_*`` function looks at one kind of fault and returns its findings; :func:`check_node`
runs them all. The inputs the Topology does not carry (SMT control, NVML health) arrive beside it, read by
:mod:`.node` or recorded for tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cpuset import format_list
from ..errors import NumarunError
from ..plan.model import PlanRequest
from ..topology.model import NicKind, Topology
from ..topology.nvml_health import (
    REASON_HW_POWER_BRAKE,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL,
    REASON_POWER_CAP,
    REASON_SW_THERMAL,
    gpu_health,
    lanes_lost,
)
from .model import Finding, Severity, sort_findings

# Peer-memory modules that give NCCL GPUDirect RDMA (the current and the legacy Mellanox name).
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
# The RDMA link layers NCCL's IB transport can use (InfiniBand, RoCE on Ethernet).
USABLE_LINK_LAYERS = ("InfiniBand", "Ethernet")

# nvmlClocksEventReasons bits (nvml.h, nvmlClocksThrottleReason* in older headers).
THROTTLE_WARN = {
    REASON_HW_SLOWDOWN: "hardware slowdown (HW_SLOWDOWN: thermal or power brake asserted)",
    REASON_SW_THERMAL: "software thermal slowdown",
    REASON_HW_THERMAL: "hardware thermal slowdown",
    REASON_HW_POWER_BRAKE: "hardware power-brake slowdown",
}


def check_pcie_links(topo: Topology) -> list[Finding]:
    devices = [(g.pci_bus_id, f"GPU {g.index}", g.pcie_link) for g in topo.gpus]
    devices += [(n.pci_bus_id or n.name, f"NIC {n.name}", n.pcie_link) for n in topo.nics]
    return [
        Finding(
            Severity.ERROR if lanes_lost(link.current_width, link.max_width) else Severity.WARN,
            "pcie-link",
            bus,
            f"{what} PCIe link runs at {link.current_gts:g} GT/s x{link.current_width}, below its maximum "
            f"{link.max_gts:g} GT/s x{link.max_width}: "
            + (
                "reseat the card or check the slot, riser and BIOS link settings"
                if lanes_lost(link.current_width, link.max_width)
                else "GPUs lower the link speed when idle: check again under load; "
                "if it stays low, check the slot and BIOS"
            ),
        )
        for bus, what, link in devices
        if link.degraded
    ]


def check_rdma_ports(topo: Topology) -> list[Finding]:
    """The RDMA ports the Topology carries (sysfs ``ports/<N>/{state,link_layer}``, hwloc, snapshots)."""
    out = []
    for nic in sorted(topo.nics, key=lambda n: n.name):
        active = any(p.active for p in nic.ports)
        for p in nic.ports:
            where = f"{nic.name}:{p.number}"
            rules = (
                (not p.state, Severity.INFO, "rdma-port", f"RDMA port {where}: state not recorded; not checked"),
                (
                    not p.active,
                    Severity.WARN if active else Severity.ERROR,
                    "rdma-port",
                    f"RDMA port {where} is {p.state}, not ACTIVE: NCCL cannot use it; "
                    "check the cable and the switch port (ibstat), or leave the device out with NCCL_IB_HCA",
                ),
                (
                    p.link_layer and p.link_layer not in USABLE_LINK_LAYERS,
                    Severity.WARN,
                    "rdma-link-layer",
                    f"RDMA port {where} has link layer {p.link_layer!r}; the plan uses only InfiniBand or Ethernet "
                    "(RoCE) ports: this device is not a compute NIC",
                ),
                (
                    p.link_layer == "Ethernet" and not nic.netdevs,
                    Severity.WARN,
                    "rdma-link-layer",
                    f"RoCE port {where} has no network interface: RoCE needs one for its GID; "
                    "bring the interface up or leave the device out with NCCL_IB_HCA",
                ),
            )
            hit = next((r for r in rules if r[0]), None)  # the first rule that holds is the port's finding
            if hit is not None:
                out.append(Finding(hit[1], hit[2], where, hit[3]))
    return out


def check_numa_unknown(topo: Topology) -> list[Finding]:
    if sum(1 for n in topo.numa_nodes if n.cpus) <= 1:
        return []  # -1 is what a single-node machine reports; nothing to choose
    gpus = [
        Finding(
            Severity.WARN,
            "numa-unknown",
            g.pci_bus_id,
            f"GPU {g.index} reports NUMA node -1 on a machine with {len(topo.numa_nodes)} NUMA nodes: its rank "
            "cannot be placed next to it; enable ACPI SRAT/_PXM in the BIOS (or the VM's NUMA passthrough)",
        )
        for g in topo.gpus
        if g.numa_node < 0
    ]
    return gpus + [
        Finding(
            Severity.WARN if n.kind in (NicKind.INFINIBAND, NicKind.ROCE) else Severity.INFO,
            "numa-unknown",
            n.name,
            f"NIC {n.name} reports NUMA node -1 on a machine with {len(topo.numa_nodes)} NUMA nodes: "
            "the closest NIC per rank is a guess; enable ACPI SRAT/_PXM in the BIOS",
        )
        for n in topo.nics
        if n.numa_node < 0 and n.pci_bus_id
    ]


def check_peermem(topo: Topology) -> list[Finding]:
    rdma = [n.name for n in topo.nics if n.kind in (NicKind.INFINIBAND, NicKind.ROCE)]
    nvidia = [g for g in topo.gpus if g.vendor == "nvidia"]
    if not rdma or not nvidia:
        return []
    if topo.kernel_modules is None:
        return [
            Finding(
                Severity.INFO,
                "peermem",
                "kernel",
                "the loaded kernel modules are unknown (no proc/modules): GPUDirect RDMA not checked",
            )
        ]
    if any(m in topo.kernel_modules for m in PEERMEM_MODULES):
        return []
    return [
        Finding(
            Severity.WARN,
            "peermem",
            ",".join(rdma),
            "RDMA NICs and NVIDIA GPUs are present but nvidia_peermem is not loaded: NCCL falls back to "
            "copies through host memory unless the driver and kernel support DMA-BUF; run 'modprobe nvidia_peermem'",
        )
    ]


def check_cpus(topo: Topology, request: PlanRequest, smt_control: str = "") -> list[Finding]:
    """Usable cores against ranks, allowed memory nodes, offline CPUs, SMT state."""
    out = []
    from ..plan.binding import make_plan

    usable = topo.usable_cpus
    cores = {topo.cpu(c).core_key for c in usable}
    try:
        plan = make_plan(topo, request)
        nproc = plan.nproc_per_node
        out += [Finding(Severity.WARN, "plan", "plan", w) for w in plan.warnings]
    except NumarunError as e:
        nproc = request.nproc_per_node if isinstance(request.nproc_per_node, int) else max(len(topo.gpus), 1)
        out.append(
            Finding(Severity.ERROR, "plan", format_list(usable) or "-", f"the binding cannot be planned here: {e}")
        )
    disallowed = sorted(c.id for c in topo.cpus if c.online and not c.allowed)
    offline = sorted(c.id for c in topo.cpus if not c.online)
    found = (
        (
            len(cores) < nproc,
            Severity.ERROR,
            "cpus",
            format_list(usable) or "-",
            f"{len(cores)} usable physical cores ({len(usable)} CPUs allowed by the cgroup/affinity) for "
            f"{nproc} ranks: ask the scheduler for more CPUs (--cpus-per-task) or start fewer ranks",
        ),
        (
            disallowed and len(cores) >= nproc,
            Severity.INFO,
            "cpus",
            format_list(disallowed),
            f"{len(disallowed)} online CPUs are outside this process's cgroup/affinity; ranks are bound within the "
            "rest",
        ),
        (
            offline,
            Severity.WARN,
            "cpus-offline",
            format_list(offline),
            f"{len(offline)} CPUs are offline: the node runs below its core count; bring them online "
            "(echo 1 > /sys/devices/system/cpu/cpuN/online) unless that is intended",
        ),
    )
    out += [Finding(severity, check, device, text) for wrong, severity, check, device, text in found if wrong]
    if topo.allowed_mems:
        allowed = set(topo.allowed_mems)
        wanted = {g.numa_node for g in topo.gpus if g.numa_node >= 0} | {
            n.id for n in topo.numa_nodes if n.cpus and any(topo.cpu(c).allowed for c in n.cpus)
        }
        out += [
            Finding(
                Severity.WARN,
                "mems",
                f"node{node}",
                f"NUMA node {node} is not in the cgroup's allowed memory nodes ({format_list(sorted(allowed))}): "
                "ranks near it allocate on a remote node; ask the scheduler for that node's memory (cpuset.mems)",
            )
            for node in sorted(wanted - allowed)
        ]
    smt = smt_control.strip()
    if smt:
        siblings = any(len(topo.cpu(c).siblings) > 1 for c in usable)
        out.append(
            Finding(
                Severity.INFO,
                "smt",
                "cpu",
                f"SMT is {_SMT.get(smt, smt)}"
                + (" (hardware threads share cores: ranks get whole cores)" if siblings else ""),
            )
        )
    return out


# sysfs smt/control values (Documentation/ABI/testing/sysfs-devices-system-cpu) in words
_SMT = {
    "forceoff": "off (forced)",
    "notsupported": "not supported by this CPU",
    "notimplemented": "not known to this kernel",
}


def check_nvml(record: Mapping[str, Any] | None) -> list[Finding]:
    """ECC errors, pending page retirement / row remapping, throttling, persistence mode.

    Health keys per GPU in the record (missing or ``"ERR ..."``: not checked):
    ``ecc_uncorrected_volatile``, ``ecc_uncorrected_aggregate``, ``retired_pages_pending`` (0/1),
    ``remapped_rows`` ``[correctable, uncorrectable, pending, failure]``,
    ``throttle_reasons`` (nvmlClocksEventReasons bitmask), ``persistence_mode`` (0/1).
    """
    if not record or not isinstance(record.get("gpus"), list):
        return []
    out = []
    for pos, g in enumerate(record["gpus"]):
        if not isinstance(g, Mapping):
            continue
        health = gpu_health(g, pos)  # the answers parsed as the step report parses them
        dev = health.pci_bus_id or str(g.get("pci_bus_id", f"GPU {pos}"))
        name = f"GPU {g.get('index', pos)}"
        vol, agg = health.ecc_uncorrected, health.ecc_uncorrected_aggregate
        _corr, uncorr, pending, failure = health.remapped_rows or (0, 0, 0, 0)
        bad = [text for bit, text in THROTTLE_WARN.items() if (health.reasons or 0) & bit]
        found = (
            (
                vol,
                Severity.ERROR,
                "nvml-ecc",
                f"{name} has {vol} uncorrected ECC errors since the driver loaded: results may be wrong; "
                "drain the node and reset the GPU (nvidia-smi -r), replace it if they return",
            ),
            (
                agg and not vol,
                Severity.WARN,
                "nvml-ecc",
                f"{name} has {agg} uncorrected ECC errors over its lifetime: watch it",
            ),
            (
                health.retired_pending,
                Severity.ERROR,
                "nvml-retirement",
                f"{name} has a page retirement pending: reset the GPU (nvidia-smi -r) before running",
            ),
            (
                failure,
                Severity.ERROR,
                "nvml-row-remap",
                f"{name}: row remapping failed (no spare rows left): replace the GPU",
            ),
            (
                pending and not failure,
                Severity.ERROR,
                "nvml-row-remap",
                f"{name} has a row remapping pending: reset the GPU (nvidia-smi -r) before running",
            ),
            (
                uncorr and not pending and not failure,
                Severity.INFO,
                "nvml-row-remap",
                f"{name} has {uncorr} rows remapped after uncorrectable errors",
            ),
            (
                bad,
                Severity.WARN,
                "nvml-throttle",
                f"{name} clocks are held down: {', '.join(bad)}; check cooling and power",
            ),
            (
                (health.reasons or 0) & REASON_POWER_CAP,
                Severity.INFO,
                "nvml-throttle",
                f"{name} clocks limited by software power cap",
            ),
            (
                health.persistence == 0,
                Severity.WARN,
                "nvml-persistence",
                f"{name} has persistence mode off: every job start re-initialises the driver "
                "(seconds); enable nvidia-persistenced or 'nvidia-smi -pm 1'",
            ),
        )
        out += [Finding(severity, check, dev, text) for wrong, severity, check, text in found if wrong]
    return out


def check_hostname(
    hostname: str, resolved: Sequence[str], own: Mapping[str, str], address: str | None, *, multi_node: bool
) -> list[Finding]:
    """Whether the hostname resolves (``resolved``: its addresses), to what, and the address numarun uses
    (``address``: what a job of several nodes advertises; None: this host has none but loopback or link-local)."""
    from ..launch.net import loopback

    if address is None:
        return [
            Finding(
                Severity.ERROR if multi_node else Severity.WARN,
                "hostname",
                hostname,
                "this host has no address but loopback or link-local: other nodes cannot reach it; fix: attach "
                "a network (docker run --network host) or give --local-addr ADDR",
            )
        ]
    found, local = ", ".join(resolved), [a for a in resolved if loopback(a)]
    severity, what = (
        (Severity.INFO, f"resolves to {found}")
        if local or set(resolved) & set(own)
        else (
            Severity.WARN,
            f"resolves to {found}, not an address of this host"
            if resolved
            else "does not resolve (torchrun hangs on such a host)",
        )
    )
    if resolved and len(local) == len(resolved):
        severity = Severity.WARN if multi_node else Severity.INFO
        what = (
            f"resolves to loopback {found} only: other nodes cannot reach this one by it (torchrun then lets no node "
            "host the c10d store at this node's IP)"
        )
    text = (
        f"hostname {hostname!r} {what}; numarun uses 127.0.0.1 for a job of one node and {address} "
        f"({own.get(address, '?')}) for several"
    )
    fix = f"; fix: map it in /etc/hosts ('{address} {hostname}'; docker run --add-host {hostname}:{address})"
    return [Finding(severity, "hostname", hostname, text + ("" if what == f"resolves to {found}" else fix))]


def check_node(
    topo: Topology, request: PlanRequest, smt_control: str = "", nvml: Mapping[str, Any] | None = None
) -> tuple[Finding, ...]:
    """Every one-node check, errors first. ``smt_control``: ``sys/devices/system/cpu/smt/control`` (on, off,
    forceoff, notsupported; "" unknown); ``nvml``: an NVML record (:mod:`numarun.topology.nvml` shape plus the health
    keys; None without NVML)."""
    findings = (
        check_pcie_links(topo)
        + check_rdma_ports(topo)
        + check_numa_unknown(topo)
        + check_peermem(topo)
        + check_cpus(topo, request, smt_control)
        + check_nvml(nvml)
    )
    return sort_findings(findings)
