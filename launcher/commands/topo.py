"""``numarun topo``: show the node's topology as text, a JSON snapshot, or an SVG picture."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from .. import argtypes
from ..errors import TopologyError, UsageError
from ..fsutil import write_output
from ..options.launch import add_options, from_args
from ..topology.model import Topology

log = logging.getLogger(__name__)

MAX_WIDTH = 10000
"""Columns of the table view: wider than any terminal, small enough to render."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "topo",
        help="show NUMA nodes, CPUs, GPUs, links and NICs of this node",
        description="Show the node's topology: NUMA nodes and their CPUs and memory, GPUs with "
        "their NUMA node and nearest NIC, the GPU link matrix, NICs. --json prints the snapshot "
        "that --topology reads back; --svg draws the picture.",
    )
    add_options(p, ("topology",))
    p.add_argument("--json", action="store_true", help="print the JSON snapshot instead of the table view")
    p.add_argument("--svg", metavar="FILE", default=None, help="also write an SVG picture of the topology to FILE")
    p.add_argument(
        "--smi",
        metavar="FILE",
        default=None,
        help="a saved 'nvidia-smi topo -m' text used for GPUs and their links when the main source has no GPUs",
    )
    p.add_argument(
        "--width",
        type=argtypes.int_in("--width", low=1, high=MAX_WIDTH),
        default=None,
        help="text width of the table view (default: terminal width)",
    )
    p.set_defaults(func=main)
    return p


def merge_smi(topology: Topology, smi_path: str) -> Topology:
    """Take GPUs, NICs and links from a saved ``nvidia-smi topo -m`` when ``topology`` has no GPUs."""
    if topology.gpus:
        log.warning(
            "--smi %s ignored: %s already lists %d GPUs",
            smi_path,
            topology.source or "the topology",
            len(topology.gpus),
        )
        return topology
    try:
        text = Path(smi_path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise TopologyError(
            f"bad --smi file {smi_path!r}: {e.strerror}; expected a saved 'nvidia-smi topo -m' text"
        ) from None
    from ..topology.smi import topology_from_smi

    smi = topology_from_smi(text, smi_path)
    return dataclasses.replace(
        topology,
        gpus=smi.gpus,
        gpu_links=smi.gpu_links,
        nics=topology.nics or smi.nics,
        nic_links=smi.nic_links if not topology.nics else (),
        gpu_source="nvidia-smi",
        notes=topology.notes + (f"GPUs and links from {smi_path}",),
    )


def main(args: argparse.Namespace) -> int:
    import os

    from ..topology.discover import load_topology

    source = from_args(args, os.environ).shown().topology
    out_svg = args.svg
    if out_svg is not None:
        # refuse before doing any work, so nothing is half-done
        parent = Path(out_svg).parent
        if not parent.is_dir():
            raise UsageError(
                f"bad --svg {out_svg!r}: directory {str(parent)!r} does not exist; expected a file in an existing "
                "directory"
            )
    if args.width is not None and args.width < 40:
        raise UsageError(f"bad --width {args.width!r}: expected an integer of at least 40")

    topology = load_topology(source)
    if args.smi:
        topology = merge_smi(topology, args.smi)

    if out_svg is not None:
        from ..view.svg import render_svg

        write_output(out_svg, render_svg(topology), flag="--svg")
        log.info("wrote %s", out_svg)

    if args.json:
        sys.stdout.write(topology.to_json())
    else:
        import shutil

        from ..view.topo import render_text

        width = args.width or max(100, shutil.get_terminal_size((120, 24)).columns)
        snapshot = source if source and str(source).endswith(".json") else None
        from ..launch.planning import container_at

        found = container_at(source) if snapshot is None else None
        sys.stdout.write(
            render_text(
                topology,
                width=width,
                color=sys.stdout.isatty(),
                snapshot=snapshot,
                container=found.describe() if found else "",
            )
        )
        if out_svg is not None:
            sys.stdout.write(f"picture written to {out_svg}\n")
    return 0
