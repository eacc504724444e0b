"""What the doctor reports: findings and per-node reports. Pure, JSON-able."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    """How bad a finding is; the command exits 1 when any finding is an error."""

    ERROR = "error"
    """The job would fail or run far below speed here."""
    WARN = "warn"
    """Likely to cost speed or robustness."""
    INFO = "info"
    """A fact worth knowing (SMT state, what was not checked)."""


SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARN: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found."""

    severity: Severity
    check: str  # pcie-link, rdma-port, nvml-ecc...
    device: str  # a PCI bus id, NIC name, CPU list, NUMA node, node rank
    message: str  # what is wrong and what to do

    def to_dict(self) -> dict[str, str]:
        return {"severity": self.severity.value, "check": self.check, "device": self.device, "message": self.message}


def sort_findings(findings: list[Finding] | tuple[Finding, ...]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.check, f.device)))


def has_error(findings: list[Finding] | tuple[Finding, ...]) -> bool:
    return any(f.severity is Severity.ERROR for f in findings)


@dataclass(frozen=True)
class NodeReport:
    """One node's checks and figures, as it sends them to node rank 0."""

    node_rank: int
    hostname: str
    findings: tuple[Finding, ...]
    facts: dict[str, Any] = field(default_factory=dict)  # what the nodes must agree on
    figures: dict[str, Any] = field(default_factory=dict)  # mem_bw_gbs per NUMA node, h2d_gbs per GPU, link_gbs

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_rank": self.node_rank,
            "hostname": self.hostname,
            "findings": [f.to_dict() for f in self.findings],
            "facts": self.facts,
            "figures": self.figures,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReport:
        findings = tuple(
            Finding(Severity(f["severity"]), f["check"], f["device"], f["message"]) for f in data.get("findings", [])
        )
        return cls(
            node_rank=int(data["node_rank"]),
            hostname=str(data["hostname"]),
            findings=findings,
            facts=dict(data.get("facts", {})),
            figures=dict(data.get("figures", {})),
        )
