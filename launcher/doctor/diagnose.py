"""The doctor's run: one node's checks, or every node's through node 0's store, as the flags say.

Called by ``numarun doctor`` and by the pre-flight of ``numarun run --preflight``; the result is a
JSON-able dict (``ok`` says whether no finding is an error) that :mod:`numarun.doctor.render` draws.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .. import argtypes
from ..errors import UsageError
from ..jobenv.settle import TORCHRUN_DEFAULT_PORT
from ..launch.net import resolve
from ..options.launch import LaunchOptions
from ..plan.request import request_from_options
from .schedule import LinkSchedule


@dataclass(frozen=True)
class Settings:
    """The doctor's own settings, typed, defaults here: built once from ``numarun doctor``'s flags, or from those
    ``numarun run --preflight`` shares with it (:func:`numarun.commands.doctor.settings_of`)."""

    min_link_fraction: float = 0.5
    """In (0, 1]: a node whose best pair, or one pair, is below this fraction of the median is slow."""
    doctor_timeout: float = 120.0
    link_schedule: LinkSchedule = LinkSchedule.AUTO
    link_seconds: float = 0.5
    nvml_record: str | None = None
    measure: bool = False
    no_measure: bool = False


def fixed_nodes(options: LaunchOptions) -> int:
    """The node count the doctor checks: ``--nnodes N`` (or ``N:N``); an elastic range is refused."""
    nnodes = options.nnodes
    if nnodes.elastic:
        where = options.setting("nnodes").where
        raise UsageError(f"bad {where} {str(nnodes)!r}: expected a fixed count N (or N:N; the doctor needs one)")
    return nnodes.min


def rendezvous(options: LaunchOptions, *, port_offset: int = 0, endpoint: bool = True) -> tuple[str, int]:
    """(host, port) of node 0's store from --master-addr/--master-port or --rdzv-endpoint (``endpoint`` False:
    a static rendezvous's, not read); the host resolves. Without a port, torchrun's static rendezvous's."""
    stated = options.stated()
    given_endpoint = str(options.rdzv_endpoint or "") if endpoint else ""
    flag = options.setting("rdzv_endpoint").where if given_endpoint else options.setting("master_addr").where
    if not (given_endpoint or "master_addr" in stated):
        raise UsageError("missing --master-addr (or --rdzv-endpoint): expected node rank 0's address for --nnodes > 1")
    host, given = argtypes.parse_endpoint(
        given_endpoint or options.master_addr, flag, port=None if given_endpoint else False
    )
    port = (options.master_port or TORCHRUN_DEFAULT_PORT) if given is None else given
    if not 0 < port + port_offset < 65536:
        raise UsageError(f"bad --master-port {port!r}: expected a port 1..65535")
    ip = argtypes.ip_address(host)
    if ip is not None and ip.version == 6 and ip.is_link_local and "%" not in host:  # no socket can bind or reach it
        raise UsageError(
            f"bad {flag} {given_endpoint or host!r}: a link-local address is one only with its interface; "
            f"expected {argtypes.host_port(f'{host}%IFACE', given) if given else f'{host}%IFACE'} (such as %eth0)"
        )
    resolve(host, flag=flag)
    return host, port + port_offset


def diagnose(
    options: LaunchOptions, settings: Settings, *, port_offset: int = 0, endpoint: bool = True
) -> dict[str, Any]:
    """Run the doctor with the launch options and its own settings; returns the JSON-able result (``ok`` says
    whether no error). ``port_offset``, ``endpoint``: :func:`rendezvous`."""
    from ..doctor.model import has_error
    from ..doctor.multinode import exchange
    from ..doctor.node import Inputs, run_node

    nnodes = fixed_nodes(options)
    node_rank = int(options.node_rank or 0)
    if nnodes > 1:
        host, port = rendezvous(options, port_offset=port_offset, endpoint=endpoint)
        if not 0 <= node_rank < nnodes:
            raise UsageError(f"bad --node-rank {node_rank!r}: expected 0..{nnodes - 1}")
    inputs = Inputs(
        topology=options.topology,
        request=request_from_options(options, os.environ),
        nvml_record=settings.nvml_record,
        measure=(nnodes > 1 and not settings.no_measure) or settings.measure,
        compare=nnodes > 1,
        endpoint=host if nnodes > 1 else None,
    )
    report, topo = run_node(inputs, node_rank=node_rank if nnodes > 1 else 0)
    if nnodes == 1:
        failed = has_error(report.findings)
        return {
            "findings": [f.to_dict() for f in report.findings],
            "hostname": report.hostname,
            "source": topo.source,
            "facts": report.facts,
            "figures": report.figures,
            "ok": not failed,
            "exclude": report.hostname if failed else "",
        }
    verdict = exchange(
        report,
        nnodes=nnodes,
        master_addr=host,
        master_port=port,
        min_link_fraction=settings.min_link_fraction,
        seconds=settings.link_seconds,
        timeout_s=settings.doctor_timeout,
        schedule=settings.link_schedule,
    )
    verdict["node_rank"] = node_rank
    return verdict
