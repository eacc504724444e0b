"""The doctor's report as text: a table of nodes, a table of findings, a verdict line (rich)."""

from __future__ import annotations

from typing import Any

NODE_ROWS = 32  # above it, the table lists only the nodes with an error or a warning


def render(result: dict[str, Any]) -> str:
    from rich.console import RenderableType
    from rich.table import Column, Table

    from .. import tables
    from ..cpuset import format_list

    items: list[RenderableType] = []
    nodes = result.get("nodes")
    if nodes:
        slow = set(result.get("slow_nodes", []))
        in_links = {x for link in result.get("slow_links", []) for x in link[:2]}
        shown = [
            n
            for n in nodes
            if len(nodes) <= NODE_ROWS
            or n["node_rank"] in slow | in_links
            or any(f["severity"] in ("error", "warn") for f in n["findings"])
        ]
        t = Table(
            "rank", "host", "errors", "warns", "link GB/s", "peers", "mem GB/s per NUMA node", "h2d GB/s", title="nodes"
        )
        for n in shown:
            sev = [f["severity"] for f in n["findings"]]
            fig = n["figures"]
            mem = " ".join(f"{k}:{v:g}" for k, v in (fig.get("mem_bw_gbs") or {}).items()) or "-"
            h2d = " ".join(f"{v:g}" for v in (fig.get("h2d_gbs") or {}).values()) or "-"
            link = f"{fig.get('link_gbs', 0):.3f}" + (" SLOW" if n["node_rank"] in slow else "")
            t.add_row(
                str(n["node_rank"]),
                n["hostname"],
                str(sev.count("error")),
                str(sev.count("warn")),
                link,
                str(fig.get("link_peers", "-")),
                mem,
                h2d,
            )
        if len(shown) < len(nodes):
            t.caption = f"{len(nodes) - len(shown)} more nodes without an error or a warning (--json lists every node)"
        items.append(t)
    # a finding several nodes share is one row naming them all
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    for f in result.get("findings", []):
        rows.setdefault((f["severity"], f["check"], f["device"], f["message"]), [])
    for n in nodes or ():
        for f in n["findings"]:
            rows.setdefault((f["severity"], f["check"], f["device"], f["message"]), []).append(n["node_rank"])
    t = Table(
        *(["node"] if nodes else []),
        *(Column(col, overflow="fold") for col in ("severity", "check", "device", "message")),
        title="findings" if rows else "findings: none",
    )
    for cells, ranks in rows.items():
        t.add_row(*(([format_list(ranks) or "all"] if nodes else []) + list(cells)))
    items.append(t)
    verdict = "OK: no errors" if result.get("ok") else "NOT OK: errors found"
    if result.get("exclude"):
        verdict += f"; leave out: --exclude={result['exclude']}"
    return tables.render(*items, verdict, width=160)
