"""The doctor's run: one node's checks, or every node's through node 0's store, as the flags say.

Called by ``numarun doctor`` and by the pre-flight of ``numarun run --preflight``; the result is a
JSON-able dict (``ok`` says whether no finding is an error) that :mod:`numarun.doctor.render` draws.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import argtypes
from ..errors import UsageError
from ..launch.net import resolve
from ..plan.options import request_from_args


def parse_nnodes(text: str) -> int:
    parts = str(text).split(":")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if not values or len(values) > 2 or not 1 <= min(values) <= max(values) <= argtypes.MAX_NODES or (
            len(values) == 2 and values[0] != values[1]):
        raise UsageError(f"bad --nnodes {text!r}: expected a positive integer N up to {argtypes.MAX_NODES} "
                         "(or N:N; the doctor needs a fixed count)")
    return values[0]


def rendezvous(args: argparse.Namespace, *, port_offset: int = 0) -> tuple[str, int]:
    """(host, port) of node 0's store from --master-addr/--master-port or --rdzv-endpoint; the host resolves."""
    endpoint = getattr(args, "rdzv_endpoint", "")
    flag = "--rdzv-endpoint" if endpoint else "--master-addr"
    if not (endpoint or args.master_addr):
        raise UsageError("missing --master-addr (or --rdzv-endpoint): expected node rank 0's address for --nnodes > 1")
    host, given = argtypes.parse_endpoint(endpoint or args.master_addr, flag, port=None if endpoint else False)
    port = (29500 if args.master_port is None else args.master_port) if given is None else given
    if not 0 < port + port_offset < 65536:
        raise UsageError(f"bad --master-port {port!r}: expected a port 1..65535")
    resolve(host, flag=flag)
    return host, port + port_offset


def check_fraction(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise UsageError(f"bad --min-link-fraction {value!r}: expected a number in (0, 1] such as 0.5")
    return value


def diagnose(args: argparse.Namespace, *, port_offset: int = 0) -> dict[str, Any]:
    """Run the doctor as the parsed flags say; returns the JSON-able result (``ok`` says whether no error)."""
    from ..doctor.model import has_error
    from ..doctor.multinode import exchange
    from ..doctor.node import Inputs, run_node
    from ..doctor.schedule import LinkSchedule

    nnodes = parse_nnodes(args.nnodes)
    fraction = check_fraction(args.min_link_fraction)
    if nnodes > 1:
        host, port = rendezvous(args, port_offset=port_offset)
        if not 0 <= args.node_rank < nnodes:
            raise UsageError(f"bad --node-rank {args.node_rank!r}: expected 0..{nnodes - 1}")
    inputs = Inputs(
        topology=args.topology,
        request=request_from_args(args, os.environ),
        nvml_record=getattr(args, "nvml_record", None),
        measure=(nnodes > 1 and not getattr(args, "no_measure", False)) or getattr(args, "measure", False),
        compare=nnodes > 1,
        endpoint=host if nnodes > 1 else None,
    )
    report, topo = run_node(inputs, node_rank=args.node_rank if nnodes > 1 else 0)
    if nnodes == 1:
        return {
            "findings": [f.to_dict() for f in report.findings],
            "hostname": report.hostname,
            "source": topo.source,
            "facts": report.facts,
            "figures": report.figures,
            "ok": not has_error(report.findings),
            "exclude": report.hostname if has_error(report.findings) else "",
        }
    verdict = exchange(report, nnodes=nnodes, master_addr=host, master_port=port, min_link_fraction=fraction,
                       seconds=args.link_seconds, timeout_s=args.doctor_timeout,
                       schedule=LinkSchedule(getattr(args, "link_schedule", None) or "auto"))
    verdict["node_rank"] = args.node_rank
    return verdict


NODE_ROWS = 32
"""Above this many nodes the table lists only the nodes with an error or a warning."""
