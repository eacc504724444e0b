"""The roll-call's keys in the job's store (``numarun/hang/<restart>/``, through the agent's one
:class:`~numarun.launch.exchange.Exchange`): ``node/<n>`` each node's summary, rewritten every sample; ``ask`` a
counter of roll-calls and ``ask/<k>`` who asked; ``answer/<k>/<n>`` each node's stands; ``stop`` and ``stopped`` for
``--on-hang stop``. A store that has gone answers nothing: the watchdog goes on with its own node."""

from __future__ import annotations

import dataclasses

from ..exchange import Keys
from .node import NodeCall
from .verdict import HangSummary

ANSWER_WAIT_S = 90.0
"""How long the judge waits for the other nodes' stands (a sample, the dumps, py-spy's native unwinding)."""


class RollCallKeys:
    """One restart's roll-call keys; one thread uses it."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self.seen = 0

    def publish(self, summary: HangSummary) -> None:
        self.keys.set_json(f"node/{summary.node}", dataclasses.asdict(summary))

    def summaries(self, nodes: int) -> list[HangSummary]:
        return [HangSummary(**d) for n in range(nodes) if isinstance(d := self.keys.get_json(f"node/{n}"), dict)]

    def ask(self, why: str, by: int) -> int | None:
        """A new roll-call's number; None when the store is gone."""
        k = self.keys.add("ask", 1)
        if k is not None:
            self.keys.set_json(f"ask/{k}", {"why": why, "by": by})
        return k

    def asks(self) -> list[tuple[int, str, int]]:
        """Roll-calls asked since the last look: (id, why, by node)."""
        cur = self.keys.add("ask", 0) or 0
        out = []
        while self.seen < cur:
            d = self.keys.get_json(f"ask/{self.seen + 1}")
            if not isinstance(d, dict):
                break  # counted, not yet described: the next look
            self.seen += 1
            out.append((self.seen, str(d["why"]), int(d["by"])))
        return out

    def answer(self, k: int, call: NodeCall) -> None:
        self.keys.set(f"answer/{k}/{call.node}", call.to_json())

    def answers(self, k: int, nodes: int) -> dict[int, NodeCall]:
        return {
            n: NodeCall.from_json(raw) for n in range(nodes) if (raw := self.keys.get(f"answer/{k}/{n}")) is not None
        }

    def stop(self, message: str, by: int) -> None:
        self.keys.set_json("stop", {"message": message, "by": by})

    def stopping(self) -> dict[str, object] | None:
        d = self.keys.get_json("stop")
        return d if isinstance(d, dict) else None

    def ack(self) -> int | None:
        return self.keys.add("stopped", 1)

    def acks(self) -> int | None:
        return self.keys.add("stopped", 0)
