"""The job's rendezvous store as numarun's node agent uses it: one client per agent, each use's keys apart.

Nodes meet in the store torchrun's rendezvous already has (c10d's, on the rendezvous host; ``MASTER_ADDR:PORT``'s
with the static backend): the hang watchdog's roll-calls and the step report's views go through it, under
``numarun/<use>/<restart>/`` (:class:`Keys`), so that a restart's keys never meet the last one's.

A store is gone once an operation on it fails (its host's agent left at the job's end, or died): it is never asked
again, since each try costs a connect timeout and torch's client prints C++ frames for it; every later operation
answers nothing at once (None, False), and each use goes on with what it has. At the end of a job that succeeded the
agent closes the exchange before torchrun's exit barrier (:meth:`Exchange.close`): past the barrier, the store's host
may leave at any moment, so nothing of numarun's touches the store after it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

STORE_TIMEOUT_S = 5.0
"""A store operation's limit: the store answers in milliseconds while the job runs; one that does not answer in this
long has gone."""


def store_client(host: str, port: int, timeout_s: float = STORE_TIMEOUT_S) -> Any:
    """A client of the job's store (torch's TCPStore; the agent's torch is imported by now); it counts as no node
    (no ``world_size``)."""
    from torch.distributed import TCPStore

    return TCPStore(host, port, None, False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class Exchange:
    """One agent's client of the job's store (see the module docstring); safe from several threads."""

    def __init__(self, host: str, port: int, *, client: Callable[[str, int], Any] = store_client) -> None:
        self.host, self.port = host, port
        self._client = client
        self._store: Any = None
        self._lock = threading.Lock()
        self.gone = False
        """An operation failed (the store is gone or unreachable), or the exchange was closed: nothing is asked any
        more."""

    def keys(self, use: str, restart: int) -> Keys:
        """The keys of ``use`` (``hang``, ``steps``) in restart ``restart``."""
        return Keys(self, f"numarun/{use}/{restart}/")

    def call(self, op: str, *args: Any) -> Any:
        """``op`` on the store; None once it is gone (this call's failure included)."""
        with self._lock:
            if self.gone:
                return None
            try:
                if self._store is None:
                    self._store = self._client(self.host, self.port)
                return getattr(self._store, op)(*args)
            except Exception:
                self.gone = True
                return None

    def close(self) -> None:
        """No operation from now on (the client is dropped: it holds a socket to the store)."""
        with self._lock:
            self.gone = True
            self._store = None


class Keys:
    """One use's keys of one restart, under ``prefix``. Reads answer None (writes False) when the key is not there
    or the store is gone."""

    def __init__(self, exchange: Exchange, prefix: str) -> None:
        self.exchange = exchange
        self.prefix = prefix

    @property
    def gone(self) -> bool:
        return self.exchange.gone

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, without waiting for it (torch's ``get`` waits for a key that is not there)."""
        full = self.prefix + key
        if not self.exchange.call("check", [full]):
            return None
        value = self.exchange.call("get", full)
        return value if isinstance(value, bytes) else None

    def get_json(self, key: str) -> Any:
        raw = self.get(key)
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    def set(self, key: str, value: str | bytes) -> bool:
        """Whether ``key`` was set (False: the store is gone)."""
        self.exchange.call("set", self.prefix + key, value)
        return not self.gone

    def set_json(self, key: str, value: Any) -> bool:
        return self.set(key, json.dumps(value, separators=(",", ":")))

    def add(self, key: str, amount: int) -> int | None:
        """The counter ``key`` plus ``amount`` (``amount`` 0 reads it); None when the store is gone."""
        value = self.exchange.call("add", self.prefix + key, amount)
        return int(value) if value is not None else None
