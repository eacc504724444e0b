"""The node agent's one exchange through the job's store (numarun.launch.exchange): each use's keys apart, a store
that failed once never asked again, nothing asked once closed; on a real store (torch's TCPStore in this process)
and on a client that fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from numarun.launch.exchange import Exchange


def _store() -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_each_uses_keys_apart_on_a_real_store() -> None:
    server = _store()
    ex = Exchange("127.0.0.1", server.port)
    hang, steps = ex.keys("hang", 0), ex.keys("steps", 0)
    assert hang.get("node/0") is None  # not there: no wait
    assert hang.set_json("node/0", {"a": 1}) and steps.set("node/0", "view")
    assert hang.get_json("node/0") == {"a": 1} and steps.get("node/0") == b"view"
    assert ex.keys("hang", 1).get("node/0") is None  # another restart's keys
    assert hang.add("ask", 1) == 1 and hang.add("ask", 0) == 1
    assert server.get("numarun/steps/0/node/0") == b"view"
    ex.close()
    assert ex.gone and hang.get("node/0") is None and not hang.set("x", "y") and hang.add("ask", 1) is None


class Failing:
    """A client whose every operation fails (the store's host has gone); counts the tries."""

    def __init__(self) -> None:
        self.tries = 0

    def __getattr__(self, name: str) -> Any:
        def op(*args: Any) -> Any:
            self.tries += 1
            raise RuntimeError("Broken pipe")

        return op


def test_a_store_that_failed_once_is_never_asked_again() -> None:
    client = Failing()
    made: list[tuple[str, int]] = []

    def connect(host: str, port: int) -> Any:
        made.append((host, port))
        return client

    ex = Exchange("10.0.0.1", 29500, client=connect)
    keys = ex.keys("steps", 0)
    assert keys.get("table") is None and ex.gone and client.tries == 1
    assert keys.set("node/1", "v") is False and keys.add("n", 1) is None and keys.get_json("x") is None
    assert client.tries == 1 and made == [("10.0.0.1", 29500)]


def test_a_store_that_cannot_be_reached_is_gone_at_once() -> None:
    def refuse(host: str, port: int) -> Any:
        raise RuntimeError("connection refused")

    ex = Exchange("10.0.0.1", 1, client=refuse)
    assert ex.keys("hang", 0).add("ask", 0) is None and ex.gone
