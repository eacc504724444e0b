"""The step report's keys in the job's store (``numarun/steps/<restart>/``, through the agent's one
:class:`~numarun.launch.exchange.Exchange`): ``node/<n>`` each node's view, rewritten every report, and ``table``
the judge's table of the whole job, which every other node reads back. Per node O(1) keys per report, the judge
O(nodes)."""

from __future__ import annotations

import contextlib

from ...jsonable import from_jsonable, loads, to_jsonable
from ...worker.steps import LiveTable
from ..exchange import Keys
from .views import NodeView


class ViewKeys:
    """One restart's step report keys."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    @property
    def gone(self) -> bool:
        return self.keys.gone

    def publish(self, view: NodeView) -> None:
        self.keys.set_json(f"node/{view.node}", to_jsonable(view))

    def views(self, nodes: int) -> dict[int, NodeView]:
        out = {}
        for n in range(nodes):
            raw = self.keys.get(f"node/{n}")
            with contextlib.suppress(ValueError):  # a view of another numarun's format
                if raw is not None:
                    out[n] = from_jsonable(NodeView, loads(raw))
        return out

    def publish_table(self, table: LiveTable) -> None:
        self.keys.set("table", table.text())

    def table(self) -> LiveTable | None:
        raw = self.keys.get("table")
        try:
            return LiveTable.parse(raw.decode()) if raw is not None else None
        except ValueError:  # a SchemaError too
            return None
