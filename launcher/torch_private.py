"""Every use of torch's private parts, in one place, each guarded by the torch versions it was checked on.

numarun drives torchrun from inside its own process and reaches into it in these places:

* **GC paused while torch is imported** (:func:`import_torchrun`; public API, a cost saving);
* **``get_method_name`` of the dynamic rendezvous replaced** (:func:`install`): a private function;
* **the dynamic rendezvous's node descriptors keyed** (:func:`order_nodes`): c10d ranks the nodes by sorting
  their descriptors (``_NodeDesc``: address, pid, id); with a layout each node's descriptor carries the key it
  reports first (:class:`KeyedNodeDesc`, through the handler class's ``_node_desc_generator``), so that the nodes
  get node ranks in key order, not in the string order of their addresses;
* **torchelastic's messages**: the error file a rank writes (:func:`record_error`, the layout of
  ``ErrorHandler.record_exception``) and what numarun reads back from a failed run (:func:`failure_cause`,
  :func:`runtime_cause`);
* **torchrun's exit barrier joined** (:func:`before_exit_barrier`): the agent's ``_exit_barrier`` (private) calls
  numarun's node agent first, so that its last exchange through the store happens while every node is still there;
  and the dynamic rendezvous's ``shutdown`` waits, briefly, until every node has shut it down: the node that hosts
  c10d's store would otherwise leave while another's shutdown still writes to it (torch then prints C++ frames);
* **torch's ``SignalException``** raised by numarun's own death-signal handler, exactly as torchrun's
  (private) ``_terminate_process_handler`` raises it, which torchrun installs numarun's handler in place
  of (:func:`route_signals`; its own raises again on a second signal, in the middle of its shutdown).

:data:`CHECKED` names the torch versions these were checked on; outside them the private patch is
skipped (torch behaves as plain torchrun, only slower) and ``tests/toplevel/test_torch_private.py``
fails when torch changes the shape of anything patched here, so the next torch is checked on purpose.
``scripts/bench_launch.py`` measures the launch against plain torchrun.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import re
import signal
import sys
import time
import types
from typing import Any

log = logging.getLogger(__name__)

CHECKED = ((2, 4), (2, 15))
"""torch versions (inclusive, major.minor) whose private parts used here were read and tested."""


def installed_torch_version() -> str | None:
    """The installed torch's version, from its package metadata (torch is not imported); None without torch."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def torch_version() -> tuple[int, int] | None:
    """torch's (major, minor), as :func:`installed_torch_version`."""
    text = installed_torch_version() or ""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def checked(version: tuple[int, int] | None = None) -> bool:
    """Whether this torch is one the private patches were checked on."""
    v = version if version is not None else torch_version()
    return v is not None and CHECKED[0] <= v <= CHECKED[1]


CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"
"""The variable torch's C++ logging reads once, as torch is first imported."""
_USERS_CPP_LOG: list[str | None] = []
"""The user's TORCH_CPP_LOG_LEVEL while numarun's own is set (:func:`quiet_cpp_logs`), for the workers."""


def quiet_cpp_logs() -> None:
    """numarun's own process prints none of torch's C++ warnings: the store client's ``[W ... TCPStore.cpp]`` and
    their ``frame #N:`` lines when a node that hosted the store is gone (numarun's one line says what failed). Set
    before torch's first import in this process (a run that starts torchrun: before it composes a trainer's config,
    which imports torch), for that import only: :func:`import_torchrun` puts the user's value back, so the workers
    keep it. Nothing where torch is imported already."""
    if "torch" in sys.modules or _USERS_CPP_LOG:
        return
    _USERS_CPP_LOG.append(os.environ.get(CPP_LOG_LEVEL))
    os.environ[CPP_LOG_LEVEL] = "ERROR"


def users_cpp_logs() -> None:
    """The user's TORCH_CPP_LOG_LEVEL back in the environment the workers inherit (torch read numarun's); for a
    process that becomes the user's (a rank, a Hydra app) before numarun imported torch."""
    if _USERS_CPP_LOG:
        value = _USERS_CPP_LOG.pop()
        if value is None:
            os.environ.pop(CPP_LOG_LEVEL, None)
        else:
            os.environ[CPP_LOG_LEVEL] = value


def import_torchrun() -> types.ModuleType:
    """``torch.distributed.run``, imported with the cyclic collector paused (it would walk torch's few hundred
    thousand new objects again and again: a fifth of the import on a small host), then frozen (later
    collections in this long-lived process skip them). The launcher only: workers keep Python's defaults, and
    their TORCH_CPP_LOG_LEVEL (:func:`quiet_cpp_logs`)."""
    if "torch.distributed.run" in sys.modules:
        users_cpp_logs()
        return sys.modules["torch.distributed.run"]
    enabled = gc.isenabled()
    gc.disable()
    try:
        import torch.distributed.run as run
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
        users_cpp_logs()
    return run


def method_name(depth: int = 2) -> str:
    """The name of the function ``depth`` frames up from this one, as
    ``inspect.stack()[depth].function`` gives it (``no_method_name`` past the outermost)."""
    frame: types.FrameType | None = sys._getframe(0)
    for _ in range(depth):
        frame = frame.f_back if frame is not None else None
    return frame.f_code.co_name if frame is not None else "no_method_name"


def install(module: Any | None = None) -> bool:
    """Replace ``get_method_name`` in torchrun's dynamic rendezvous module (or ``module``), which names each
    event with ``inspect.stack()`` (every frame's source file read, twice an event), by the same lookup
    by frame depth; False when that torch has no such function or was not checked (nothing changed)."""
    target: Any = module
    if target is None:
        if not checked():
            log.debug("torch %s is outside %s: torchrun's get_method_name kept", torch_version(), CHECKED)
            return False
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as target
    if getattr(target, "get_method_name", None) is None:
        return False
    target.get_method_name = method_name
    return True


@functools.cache
def _keyed_type() -> Any:
    """:class:`KeyedNodeDesc`, made once: a ``_NodeDesc`` whose order is (key, address, pid, id)."""
    import dataclasses
    import operator

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    def sort_key(d: Any) -> tuple[Any, ...]:
        return (tuple(getattr(d, "key", ())), d.addr, d.pid, d.local_id)

    def compare(op: Any) -> Any:
        def method(self: Any, other: Any) -> Any:
            return op(sort_key(self), sort_key(other)) if isinstance(other, _NodeDesc) else NotImplemented

        return method

    namespace = {
        "__annotations__": {"key": tuple},
        "key": (),
        "__module__": __name__,
        "__qualname__": "KeyedNodeDesc",
        "__doc__": "A rendezvous node descriptor that sorts by the key its node reported, then as torch's.",
        "__lt__": compare(operator.lt),
        "__le__": compare(operator.le),
        "__gt__": compare(operator.gt),
        "__ge__": compare(operator.ge),
    }
    made = type("KeyedNodeDesc", (_NodeDesc,), namespace)
    return dataclasses.dataclass(frozen=True, eq=True, order=False, repr=False)(made)


def __getattr__(name: str) -> Any:
    if name == "KeyedNodeDesc":  # the class pickle names: other nodes' agents unpickle the rendezvous state
        return _keyed_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def order_nodes(key: tuple[str, ...] | None) -> bool:
    """Make this process's dynamic (c10d, etcd-v2) rendezvous report ``key`` with its node, so that node ranks follow
    the keys of all nodes (None: torch's own descriptors again); False (nothing changed) outside :data:`CHECKED`."""
    if not checked():
        log.warning("torch %s is outside %s: c10d keeps its own node order (by address)", torch_version(), CHECKED)
        return False
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    handler = dr.DynamicRendezvousHandler
    if key is None:
        handler._node_desc_generator = dr._NodeDescGenerator()
        return True
    keyed, mine = _keyed_type(), tuple(key)

    class _Keyed(dr._NodeDescGenerator):
        def generate(self, local_addr: str | None = None) -> Any:
            plain = super().generate(local_addr)
            return keyed(plain.addr, plain.pid, plain.local_id, mine)

    handler._node_desc_generator = _Keyed()
    return True


_BEFORE_BARRIER: list[Any] = []
_LEAVING: dict[str, Any] = {}
"""Set at the exit barrier of a job that succeeded: the agents' store and how many nodes leave it."""
LEAVE_WAIT_S = 5.0
"""How long a node's rendezvous shutdown waits for the other nodes' (they come within milliseconds of each other)."""
LEFT_KEY = "numarun/left"


def before_exit_barrier(callback: Any) -> bool:
    """Have torchrun's agent call ``callback()`` when its worker group succeeded, before it waits for the other
    nodes' agents (``SimpleElasticAgent._exit_barrier``; None: nothing any more), and its rendezvous shutdown wait for
    every node's (:func:`_leave_together`); False (torch left as it is) outside :data:`CHECKED`. A failing callback is
    logged, never raised: the barrier runs anyway."""
    if not checked():
        return False
    from torch.distributed.elastic.agent.server import api

    agent = api.SimpleElasticAgent
    if getattr(agent, "_exit_barrier", None) is None:
        return False
    _BEFORE_BARRIER[:] = [callback] if callback is not None else []
    _LEAVING.clear()
    if not getattr(agent._exit_barrier, "__numarun_wrapped__", None):
        plain = agent._exit_barrier

        def _exit_barrier(self: Any) -> Any:
            for call in list(_BEFORE_BARRIER):
                try:
                    call()
                except Exception as e:
                    log.debug("before torchrun's exit barrier: %s", e, exc_info=True)
            _LEAVING.update(store=self._store, nodes=int(self._worker_group.group_world_size), host=_hosts(self._store))
            return plain(self)

        _exit_barrier.__numarun_wrapped__ = plain  # type: ignore[attr-defined]
        agent._exit_barrier = _exit_barrier  # type: ignore[method-assign]
        _leave_together()
    return True


def _hosts(store: Any) -> bool:
    """Whether this process serves ``store`` (a TCPStore, under any PrefixStore): it listens on the store's port."""
    import psutil

    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    port = getattr(store, "port", None)
    try:
        listening = psutil.Process().net_connections(kind="inet")
    except (psutil.Error, OSError):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in listening)


def _leave_together() -> None:
    """The dynamic rendezvous's ``shutdown`` (c10d's, after the exit barrier) on the node that hosts the store waits
    until every node has shut it down, at most :data:`LEAVE_WAIT_S`: that node ends its process right after, and a
    node whose shutdown came a moment later would find the store gone. The other nodes only say they are done (one
    ``add``): nothing of theirs touches the store after it."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    plain = dr.DynamicRendezvousHandler.shutdown

    def shutdown(self: Any) -> bool:
        done = plain(self)
        leaving = dict(_LEAVING)
        _LEAVING.clear()
        if leaving and done:
            try:
                store, nodes = leaving["store"], leaving["nodes"]
                left = int(store.add(LEFT_KEY, 1))
                deadline = time.monotonic() + LEAVE_WAIT_S
                while leaving["host"] and left < nodes and time.monotonic() < deadline:
                    time.sleep(0.01)
                    left = int(store.add(LEFT_KEY, 0))
                if leaving["host"]:
                    time.sleep(0.05)  # the last node's answer on its way out of this process
            except Exception as e:  # a node that died took the store with it: nothing to wait for
                log.debug("leaving the rendezvous: %s", e)
        return bool(done)

    shutdown.__numarun_wrapped__ = plain  # type: ignore[attr-defined]
    dr.DynamicRendezvousHandler.shutdown = shutdown  # type: ignore[method-assign]


def route_signals(handler: Any) -> bool:
    """Have torchrun's agent install ``handler`` for its death signals instead of its own; False (torch
    left as it is) outside :data:`CHECKED`."""
    from torch.distributed.elastic.multiprocessing import api

    if not checked() or getattr(api, "_terminate_process_handler", None) is None:
        return False
    api._terminate_process_handler = handler
    return True


_SHUTDOWN_LINES = {  # what torchrun's agent logs as it stops its workers for a signal (logger, message template)
    "torch.distributed.elastic.agent.server.api": "Received %s death signal, shutting down workers",
    "torch.distributed.elastic.multiprocessing.api": "Sending process %s closing signal %s",
}


def _not_a_shutdown_line(record: logging.LogRecord) -> bool:
    return record.msg != _SHUTDOWN_LINES.get(record.name)


def quiet_shutdown() -> None:
    """numarun stops the run for a signal and says so in one line: torchrun's own lines about it are left out
    (its other lines are kept)."""
    for name in _SHUTDOWN_LINES:
        logger = logging.getLogger(name)
        if _not_a_shutdown_line not in logger.filters:
            logger.addFilter(_not_a_shutdown_line)


_INTERNALS = {  # what torch elastic logs in numarun's process when a node fails, which numarun's one line says
    "torch.distributed.elastic.multiprocessing.errors.error_handler": "no error file defined for parent",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous": "has failed to shutdown the rendezvous",
    "torch.distributed.elastic.multiprocessing.api": "Sending process %s closing signal %s",
}


def _not_internal(record: logging.LogRecord) -> bool:
    words = _INTERNALS.get(record.name)
    return words is None or words not in str(record.msg)


def quiet_internals() -> None:
    """torch elastic's lines about its own workings, in numarun's process, are left out: the parent's error file
    it has none of, the rendezvous it could not shut down once the store's host is gone, each worker it stops after
    another failed. numarun's one line names the failed ranks; torch's ``failed (exitcode: N) local_rank: ...``, one
    line per failure, and the ranks' own tracebacks are kept."""
    for name in _INTERNALS:
        logger = logging.getLogger(name)
        if _not_internal not in logger.filters:
            logger.addFilter(_not_internal)


def signal_exception(signum: int) -> BaseException:
    """What torchrun's agent raises in its main thread for a death signal (``SignalException``), so
    that a signal during the rendezvous ends the run the way one during the run does."""
    return signal_exception_type()(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


def signal_exception_type() -> Any:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return SignalException


def failure_cause(failure: Any) -> str:
    """``ValueError: boom`` from a failed worker's torchelastic error file ('' when it wrote none)."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    if not isinstance(message, str) or not message or message.startswith(("To enable traceback", "Signal ")):
        return ""  # torchelastic's own placeholder: the worker wrote no error file
    return message.splitlines()[0]


def runtime_cause(e: BaseException) -> str:
    """``Type: first line`` of an exception, with the endpoint a network error names."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    # c10d's errors put the cause last: "... The server socket has failed to listen on any local
    # network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    if any("EADDRINUSE" in line or "address already in use" in line for line in lines):
        text = f"{text} (address already in use)"
    return f"{type(e).__name__}: {text}"


def record_error(path: str, e: BaseException, text: str) -> None:
    """Name ``e`` (``text``: its traceback) in torchelastic's error file at ``path``, as
    ``ErrorHandler.record_exception`` lays it out, so that the launcher's last line says what failed."""
    data = {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        }
    }
    with contextlib.suppress(OSError):
        with open(path, "w") as f:
            json.dump(data, f)
