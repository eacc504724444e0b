"""Nodes meet in the rendezvous store: the roll-call's keys (listed in the package docstring)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...jsonable import loads
from .node import NodeCall
from .verdict import Summary

ANSWER_WAIT_S = 90.0
"""How long the judge waits for the other nodes' stands (a sample, the dumps, py-spy's native unwinding)."""


def store_client(host: str, port: int, timeout_s: float = 10.0) -> Any:
    """A client of the job's rendezvous store (torch's TCPStore; the agent's torch is imported by now)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class Exchange:
    """One restart's keys of a job's store; one client, one thread."""

    def __init__(self, host: str, port: int, group: int) -> None:
        self.host, self.port = host, port
        self.prefix = f"numarun/hang/{group}/"
        self._store: Any = None
        self.seen = 0

    def store(self) -> Any:
        if self._store is None:
            self._store = store_client(self.host, self.port)
        return self._store

    def _get(self, key: str) -> bytes | None:
        s = self.store()
        return s.get(self.prefix + key) if s.check([self.prefix + key]) else None

    def publish(self, summary: Summary) -> None:
        self.store().set(self.prefix + f"node/{summary.node}", json.dumps(dataclasses.asdict(summary)))

    def summaries(self, nodes: int) -> list[Summary]:
        return [Summary(**loads(raw)) for n in range(nodes) if (raw := self._get(f"node/{n}")) is not None]

    def ask(self, why: str, by: int) -> int:
        k = int(self.store().add(self.prefix + "ask", 1))
        self.store().set(self.prefix + f"ask/{k}", json.dumps({"why": why, "by": by}))
        return k

    def asks(self) -> list[tuple[int, str, int]]:
        """Roll-calls asked since the last look: (id, why, by node)."""
        cur = int(self.store().add(self.prefix + "ask", 0))
        out = []
        while self.seen < cur:
            raw = self._get(f"ask/{self.seen + 1}")
            if raw is None:
                break  # counted, not yet described: the next look
            self.seen += 1
            d = loads(raw)
            out.append((self.seen, str(d["why"]), int(d["by"])))
        return out

    def answer(self, k: int, call: NodeCall) -> None:
        self.store().set(self.prefix + f"answer/{k}/{call.node}", call.to_json())

    def answers(self, k: int, nodes: int) -> dict[int, NodeCall]:
        return {n: NodeCall.from_json(raw) for n in range(nodes) if (raw := self._get(f"answer/{k}/{n}")) is not None}

    def stop(self, message: str, by: int) -> None:
        self.store().set(self.prefix + "stop", json.dumps({"message": message, "by": by}))

    def stopping(self) -> dict[str, Any] | None:
        return loads(raw) if (raw := self._get("stop")) is not None else None

    def ack(self) -> int:
        return int(self.store().add(self.prefix + "stopped", 1))

    def acks(self) -> int:
        return int(self.store().add(self.prefix + "stopped", 0))
