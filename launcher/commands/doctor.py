"""``numarun doctor``: check this node (or every node of a job) before spending GPU hours on it.

    numarun doctor [--topology PATH] [--nproc-per-node N] [--binding MODE] [--json]
    numarun doctor --nnodes N --node-rank R --master-addr A --master-port P [...]

Exit codes: 0 when no finding is an error, 1 when one is (on every node of a multi-node
run), 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import argtypes
from ..errors import UsageError
from ..plan.options import add_plan_options, request_from_args


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="check the node(s) before a job: PCIe links, RDMA ports, modules, cores, GPU health, slow nodes",
        description="Check this node from the same topology 'numarun plan' reads (a recorded tree works "
        "like the live machine); with --nnodes, every node reports to node rank 0, which compares "
        "them and measures the nodes' links in pairs (at most 6 rounds at any node count). Exit 1 when any finding is an error.",
    )
    add_plan_options(p)
    add_doctor_options(p)
    p.add_argument("--json", action="store_true", help="print {'findings': [...], ...} as JSON")
    p.add_argument("--nvml-record", metavar="FILE", default=None,
                   help="a recorded NVML answer (JSON) to check instead of asking the driver")
    p.add_argument(
        "--measure", action="store_true", help="also measure memory and host<->device bandwidth (always with --nnodes)"
    )
    p.add_argument("--no-measure", action="store_true", help="with --nnodes: measure only the links")
    g = p.add_argument_group("multi-node (torchrun's spellings)")
    g.add_argument("--nnodes", default="1", help="number of nodes (N or N:N)")
    g.add_argument("--node-rank", "--node_rank", dest="node_rank",
                   type=argtypes.int_in("--node-rank", low=0, high=argtypes.MAX_NODES - 1), default=0)
    g.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None)
    g.add_argument("--master-port", "--master_port", dest="master_port", type=argtypes.port("--master-port"), default=None)
    g.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", default="", metavar="HOST:PORT")
    g.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", default="static")
    g.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", default="none")
    g.add_argument("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default="")
    p.add_argument("--no-detect", action="store_true",
                   help="do not read the nodes from a Slurm step or mpirun's environment (also NUMARUN_DETECT=0)")
    p.set_defaults(func=main)
    global _PARSER
    _PARSER = p
    return p


def add_doctor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-link-fraction", type=float, default=0.5, metavar="F",  # check_fraction: (0, 1], no nan
                   help="a node whose best pair, or one pair, below F x the nodes' median is slow (default 0.5)")
    p.add_argument("--doctor-timeout", type=argtypes.seconds("--doctor-timeout"), default=120.0, metavar="SECONDS",
                   help="how long a node waits for the others (default 120)")
    p.add_argument("--link-schedule", type=parse_link_schedule, default="auto", metavar="NAME",
                   help="which node pairs measure their link: auto (all-pairs up to 6 nodes, else bounded), "
                   "bounded (at most 6 rounds at any node count), all-pairs (every pair, n-1 rounds)")
    p.add_argument("--link-seconds", type=argtypes.seconds("--link-seconds"), default=0.5, help=argparse.SUPPRESS)


def parse_link_schedule(text: str) -> str:
    from ..doctor.schedule import LinkSchedule

    try:
        return LinkSchedule(text).value
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad --link-schedule {text!r}: expected one of {', '.join(m.value for m in LinkSchedule)}"
        ) from None


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
    """(host, port) of node 0's store from --master-addr/--master-port or --rdzv-endpoint."""
    host, port = args.master_addr, args.master_port
    if getattr(args, "rdzv_endpoint", ""):
        ep = args.rdzv_endpoint
        h, sep, p = ep.rpartition(":")
        if not sep or not p.isdigit():
            raise UsageError(f"bad --rdzv-endpoint {ep!r}: expected HOST:PORT such as 'node0:29500'")
        host, port = h.strip("[]"), int(p)
    if not host:
        raise UsageError("missing --master-addr (or --rdzv-endpoint): expected node rank 0's address for --nnodes > 1")
    port = 29500 if port is None else port
    if not 0 < port + port_offset < 65536:
        raise UsageError(f"bad --master-port {port!r}: expected a port 1..65535")
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


def render(result: dict[str, Any]) -> str:
    import io

    from rich.console import Console
    from rich.table import Table

    from ..cpuset import format_list

    console = Console(record=True, width=160, file=io.StringIO(), color_system=None)
    style = {"error": "bold red", "warn": "yellow", "info": "dim"}
    nodes = result.get("nodes")
    if nodes:
        slow = set(result.get("slow_nodes", []))
        in_links = {x for link in result.get("slow_links", []) for x in link[:2]}

        def notable(n: dict[str, Any]) -> bool:
            return n["node_rank"] in slow | in_links or any(f["severity"] in ("error", "warn") for f in n["findings"])

        shown = nodes if len(nodes) <= NODE_ROWS else [n for n in nodes if notable(n)]
        t = Table(title="nodes", show_lines=False)
        for col in ("rank", "host", "errors", "warns", "link GB/s", "peers", "mem GB/s per NUMA node", "h2d GB/s"):
            t.add_column(col)
        for n in shown:
            sev = [f["severity"] for f in n["findings"]]
            fig = n["figures"]
            mem = " ".join(f"{k}:{v:g}" for k, v in (fig.get("mem_bw_gbs") or {}).items()) or "-"
            h2d = " ".join(f"{v:g}" for v in (fig.get("h2d_gbs") or {}).values()) or "-"
            link = f"{fig.get('link_gbs', 0):.3f}" + (" SLOW" if n["node_rank"] in slow else "")
            t.add_row(str(n["node_rank"]), n["hostname"], str(sev.count("error")), str(sev.count("warn")), link,
                      str(fig.get("link_peers", "-")), mem, h2d)
        if len(shown) < len(nodes):
            t.caption = f"{len(nodes) - len(shown)} more nodes without an error or a warning (--json lists every node)"
        console.print(t)
    # a finding several nodes share is one row naming them all
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    for f in result.get("findings", []):
        rows.setdefault((f["severity"], f["check"], f["device"], f["message"]), [])
    for n in nodes or ():
        for f in n["findings"]:
            rows.setdefault((f["severity"], f["check"], f["device"], f["message"]), []).append(n["node_rank"])
    t = Table(title="findings" if rows else "findings: none")
    if nodes:
        t.add_column("node")
    for col in ("severity", "check", "device", "message"):
        t.add_column(col, overflow="fold")
    for cells, ranks in rows.items():
        t.add_row(*(([format_list(ranks) or "all"] if nodes else []) + list(cells)), style=style.get(cells[0]))
    console.print(t)
    verdict = "OK: no errors" if result.get("ok") else "NOT OK: errors found"
    if result.get("exclude"):
        verdict += f"; leave out: --exclude={result['exclude']}"
    console.print(verdict)
    return console.export_text()


_PARSER: argparse.ArgumentParser | None = None


def _detected(args: argparse.Namespace) -> argparse.Namespace:
    """Under ``srun`` on every node (one task each), the nodes and node 0's store come from the step,
    as for ``numarun run``; the doctor's store takes the job's rendezvous port."""
    from ..jobenv import Mode
    from ..jobenv.settle import JobConflict
    from .detected import announce, detect_job, refuse, settle_node_args

    job, given = detect_job(args, _PARSER)
    if job is None:
        return args
    announce(args, job.describe())
    if job.mode is Mode.PER_RANK:
        raise UsageError(
            f"bad launch of 'numarun doctor': {job.describe()}; the doctor checks a node once: expected one task per "
            "node (srun --ntasks-per-node=1 numarun doctor)"
        )
    try:
        settled, rendezvous = settle_node_args(args, job, given)
    except JobConflict as e:
        raise SystemExit(refuse(job, e, given)) from None
    if rendezvous.own_rendezvous:
        return args
    return settled


def main(args: argparse.Namespace) -> int:
    args = _detected(args)
    result = diagnose(args)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    elif result.get("nodes") is None or result.get("node_rank", 0) == 0:
        sys.stdout.write(render(result))
    else:
        print(f"numarun doctor: node rank {result['node_rank']}: reported to node 0; "
              + ("no errors" if result["ok"] else "errors found (see node 0's report)"))
    return 0 if result["ok"] else 1
