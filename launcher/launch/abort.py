"""One node refuses to start: the others hear it through the rendezvous store, instead of waiting out a timeout.

A mistake can show on some nodes only: ``--node-rank $SLURM_NODEID`` expanded by the batch shell
gives every node rank 0, and only the nodes whose ``SLURM_NODEID`` is not 0 can tell. Those
nodes refuse (one line, exit 2) and set :data:`ABORT_KEY` in the head's store; every node's
launcher polls that key while it waits in the rendezvous (:func:`watch`), and stops naming the
node that refused. The store is the one torchrun's rendezvous creates on the head (static:
``--master-addr:--master-port``; c10d: the ``--rdzv-endpoint``); the clients here do not count
as nodes (no ``world_size``), so the rendezvous itself is not disturbed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .net import await_endpoint

ABORT_KEY = "numarun/abort"
TELL_TIMEOUT_S = 20.0
"""How long a refusing node tries to reach the head's store (it may not be up yet)."""
POLL_S = 0.5


def _client(host: str, port: int, timeout_s: float, *, give_up: Callable[[], bool] = lambda: False) -> Any:
    """A store client at host:port once the store listens there; None after ``timeout_s`` or ``give_up()``."""
    if not await_endpoint(host, port, timeout_s, give_up=give_up):
        return None
    from torch.distributed import TCPStore

    try:
        return TCPStore(host, port, None, False, timeout=timedelta(seconds=30), wait_for_workers=False)
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


def watch(host: str, port: int, *, until: Callable[[], bool], on_abort: Callable[[str], None],
          connect_timeout_s: float = 600.0) -> Callable[[], None]:
    """Poll the store at host:port for an abort message until ``until()`` holds; call ``on_abort(message)``
    when one comes. Runs in a daemon thread; returns a function that stops it."""
    stop = threading.Event()

    def loop() -> None:
        store = _client(host, port, connect_timeout_s, give_up=lambda: stop.is_set() or until())
        while store is not None and not stop.is_set() and not until():
            try:
                if store.check([ABORT_KEY]):
                    value = store.get(ABORT_KEY)
                    on_abort(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
                    return
            except Exception:
                return  # the store went away: the rendezvous reports that itself
            stop.wait(POLL_S)

    threading.Thread(target=loop, name="numarun-abort-watch", daemon=True).start()
    return stop.set
