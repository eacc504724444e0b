"""One node refuses to start (``--node-rank $SLURM_NODEID`` expanded by the batch shell gives every node
rank 0; only the others can tell): it sets :data:`ABORT_KEY` in the head's rendezvous store, and every
node's launcher, polling that key while it waits in the rendezvous (:class:`AbortWatch`), stops naming
it instead of waiting out a timeout. These store clients do not count as nodes (no ``world_size``).
"""

from __future__ import annotations

from typing import Any

from .exchange import store_client
from .net import await_endpoint

ABORT_KEY = "numarun/abort"
TELL_TIMEOUT_S = 20.0
"""How long a refusing node tries to reach the head's store (it may not be up yet)."""


def _client(host: str, port: int, timeout_s: float) -> Any:
    """A store client at host:port once the store listens there; None after ``timeout_s``."""
    if not await_endpoint(host, port, timeout_s):
        return None
    try:
        return store_client(host, port, 10)
    except Exception:
        return None


def tell(host: str, port: int, message: str, *, timeout_s: float = TELL_TIMEOUT_S) -> bool:
    """Set the abort message in the store at host:port; False when it cannot be reached in time."""
    store = _client(host, port, timeout_s)
    if store is None:
        return False  # no store there (yet): the other nodes will time out instead
    try:
        store.set(ABORT_KEY, message)
        return True
    except Exception:
        return False


class AbortWatch:
    """The abort message in the store at host:port, asked a step at a time by the supervisor's loop (until
    the rendezvous deadline): each :meth:`poll` connects once the store listens, then checks."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._store: Any = None

    def poll(self) -> str | None:
        if self._store is None:
            self._store = _client(self.host, self.port, 0)
        if not self._store:
            return None
        try:
            if self._store.check([ABORT_KEY]):
                value = self._store.get(ABORT_KEY)
                return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        except Exception:
            self._store = False  # the store went away: the rendezvous reports that itself
        return None
