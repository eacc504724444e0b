"""torchrun's options as numarun takes them: the program to run (:class:`Target`), every check, the workers' variables.

``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]`` takes torchrun's options as
torchrun's own parser declares them (read once per torch version: :func:`numarun.options.torchrun.torchrun_record`, so
every spelling torchrun accepts is accepted, and help screens need no torch), typed by the options layer.
:func:`check_torchrun_options`
refuses, in one line, every value torchrun would only reject later with a traceback, or
ignore; :mod:`numarun.launch.spec` turns the checked options into the launch spec whose argv
torchrun runs, with this package's worker bootstrap as its entrypoint::

    torchrun --nproc-per-node=2 ... <numarun>/worker/entry.py [--module] SCRIPT ARGS...
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..argtypes import MAX_COUNT, MAX_NODES, MAX_SECONDS, ONE_NODE, ascii_digits
from ..envvars import LOG_LEVEL, PLAN, PLAN_JSON, STRICT_BINDING, USER_ENV, WATCH_INTERVAL
from ..errors import UsageError
from ..plan.model import DERIVED_ENV, LaunchPlan
from ..torch_private import import_torchrun

if TYPE_CHECKING:
    from ..options.launch import LaunchOptions

log = logging.getLogger(__name__)

ENTRY_FILE = str(Path(__file__).resolve().parent.parent / "worker" / "entry.py")
"""The worker entry point, run by path so that nothing on ``sys.path`` can shadow it."""


@dataclass(frozen=True)
class Target:
    """What each worker runs after the bootstrap."""

    kind: str
    """``script`` (python SCRIPT), ``module`` (python -m MODULE) or ``exec`` (--no-python)."""
    name: str
    args: tuple[str, ...] = ()

    def bootstrap_args(self) -> list[str]:
        flag = {"module": ["--module"], "exec": ["--no-python"]}.get(self.kind, [])
        return [*flag, self.name, *self.args]

    @classmethod
    def of(cls, name: str, args: tuple[str, ...], *, module: bool, no_python: bool) -> Target:
        """The user's program, as torchrun's ``-m``/``--no-python`` say what it is; checked to exist (a module
        importable as the workers will import it, a program on PATH, a script file)."""
        if module and no_python:
            raise UsageError("bad options '--module' with '--no-python': expected at most one of them")
        if module:
            check_module(name)
        elif no_python and shutil.which(name) is None:
            raise UsageError(
                f"bad program {name!r}: not found or not executable; expected a program on PATH or a path to one"
            )
        elif not no_python and not os.path.isfile(name):
            raise UsageError(f"bad script {name!r}: no such file; expected a path to a Python script (or -m MODULE)")
        return cls("module" if module else "exec" if no_python else "script", name, args)


def check_module(name: str) -> None:
    """``-m MODULE`` must be importable as the workers will import it (the working directory
    first on the path, as ``python -m`` puts it)."""
    import importlib.util

    form = "an importable module name (python -m MODULE), e.g. pkg.train"
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        raise UsageError(f"bad module {name!r}: {e}; expected {form}") from None
    finally:
        sys.path.remove(os.getcwd())  # the first occurrence: the one just added
    if spec is None:
        raise UsageError(f"bad module {name!r}: no module of that name; expected {form}")


# torch's registered rendezvous backends (torch.distributed.elastic.rendezvous.registry).
RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# --rdzv-conf keys torch's rendezvous backends read, by the type they read them as.
RDZV_INT_KEYS = (
    "timeout",
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "read_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
)
RDZV_BOOL_KEYS = ("is_host",)
RDZV_STR_KEYS = (
    "store_type",
    "protocol",
    "cert",
    "key",
    "cacert",
    "ssl_cert",
    "ssl_cert_key",
    "ca_cert",
    "etcd_prefix",
)
_BOOL_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
# torch.distributed.elastic.events handlers
EVENT_LOG_HANDLERS = ("console", "dynamic_rendezvous", "null")


def _int_option(
    options: Mapping[str, Any], dest: str, flag: str, *, low: int, high: int | None = None, cap: int | None = None
) -> int | None:
    value = options.get(dest)
    if value is None:
        return None
    text = str(value).strip()
    form = f"a whole number >= {low} (at most {cap})" if high is None else f"a whole number from {low} to {high}"
    top = high if high is not None else cap
    if not text.lstrip("-").isdigit() or not (low <= int(text) and (top is None or int(text) <= top)):
        raise UsageError(f"bad {flag} {text!r}: expected {form}")
    return int(text)


def check_rdzv_conf(conf: str) -> dict[str, str]:
    """``key=value,...`` with the keys torch reads and values of their type."""
    form = "KEY=VALUE,... with KEY one of " + ", ".join((*RDZV_INT_KEYS, *RDZV_BOOL_KEYS, *RDZV_STR_KEYS))
    out: dict[str, str] = {}
    if not conf.strip():
        return out
    for item in conf.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise UsageError(f"bad --rdzv-conf {conf!r}: {item!r} is not KEY=VALUE; expected {form}")
        if key in RDZV_INT_KEYS:
            if not ascii_digits(value) or not 1 <= int(value) <= MAX_SECONDS:  # torch passes it to C as an int
                raise UsageError(
                    f"bad --rdzv-conf {conf!r}: {key}={value!r} is not a whole number of seconds from 1 to "
                    f"{MAX_SECONDS}; "
                    f"expected {key}=N"
                )
        elif key in RDZV_BOOL_KEYS:
            if value.lower() not in _BOOL_WORDS:
                raise UsageError(f"bad --rdzv-conf {conf!r}: {key}={value!r}; expected {key}=true or {key}=false")
        elif key not in RDZV_STR_KEYS:
            raise UsageError(f"bad --rdzv-conf {conf!r}: unknown key {key!r}; expected {form}")
        out[key] = value
    return out


def check_signals(text: str) -> tuple[str, ...]:
    """``SIGTERM,SIGINT,...``: names of signals a handler can be installed for."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    form = "a comma-separated list of signal names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    if not names:
        raise UsageError(f"bad --signals-to-handle {text!r}: expected {form}")
    for n in names:
        sig = getattr(signal, n, None) if n.startswith("SIG") and not n.startswith("SIG_") else None
        if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(
                f"bad --signals-to-handle {text!r}: {n!r} is not a signal that can be handled; expected {form}"
            )
    return names


def check_log_dir(path: str) -> None:
    """An existing writable directory, or a path whose nearest existing parent is one."""
    p = Path(path)
    probe = next((q for q in (p, *p.parents) if q.exists()), [p, *p.parents][-1])  # the nearest that exists
    if p.exists() and not p.is_dir():
        raise UsageError(f"bad --log-dir {path!r}: it exists and is not a directory; expected a directory path")
    what = "is not writable" if probe == p else f"cannot be created in {str(probe)!r}"
    if not probe.is_dir():
        raise UsageError(f"bad --log-dir {path!r}: it {what}; expected a writable directory")
    try:  # a real probe: root passes access(2) on a read-only filesystem and under /proc
        os.rmdir(tempfile.mkdtemp(prefix=".numarun-probe-", dir=probe))
    except OSError as e:
        raise UsageError(f"bad --log-dir {path!r}: it {what} ({e.strerror}); expected a writable directory") from None


def check_redirects(options: Mapping[str, Any], *, nproc: int | None) -> None:
    for dest, flag in (("redirects", "--redirects"), ("tee", "--tee")):
        value = options.get(dest)
        if value is None or value == "0":
            continue
        import_torchrun()  # torch's first import, with the collector paused
        from torch.distributed.elastic.multiprocessing.api import Std

        try:
            Std.from_str(str(value))
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"bad {flag} {value!r}: expected 0-3 (none, stdout, stderr, both) or LOCAL_RANK:0-3,... e.g. 3 or "
                "0:1,1:2"
            ) from None
    ranks = str(options.get("local_ranks_filter") or "")
    if ranks:
        parts = [r.strip() for r in ranks.split(",")]
        if not all(r.isdigit() for r in parts) or (nproc is not None and any(int(r) >= nproc for r in parts)):
            below = f" below {nproc}" if nproc is not None else ""
            raise UsageError(
                f"bad --local-ranks-filter {ranks!r}: expected comma-separated local ranks{below}, e.g. 0,1"
            )


def check_port_free(port: int) -> None:
    """The store of a static rendezvous listens on --master-port on node 0: is it free here?"""
    import errno
    import socket

    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((addr, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise UsageError(
                        f"bad --master-port {port}: another program listens on it on this host; "
                        "expected a free port (or leave it out to pick one)"
                    ) from None


def check_torchrun_options(options: Mapping[str, Any], *, nproc_per_node: int | None = None) -> None:
    """Refuse every value torchrun would only reject later with a traceback, or ignore.

    Types, ranges and names of every torchrun option numarun passes on: ``--nnodes``,
    ``--node-rank`` (below the node count), ``--rdzv-backend``,
    ``--rdzv-conf`` (known keys, typed values), ``--max-restarts``, ``--monitor-interval``,
    ``--master-port`` (and free on node 0 of a static rendezvous),
    ``--log-dir``, ``--redirects``/``--tee``, ``--local-ranks-filter``, ``--signals-to-handle``,
    ``--shutdown-timeout``, ``--event-log-handler``, ``--logs-specs``, ``--role``. The addresses are read
    (one parser, :func:`numarun.argtypes.parse_endpoint`) and resolved where the spec is built.
    """
    nnodes = options.get("nnodes") or ONE_NODE
    backend = options.get("rdzv_backend", "static")
    if backend not in RDZV_BACKENDS:
        raise UsageError(f"bad --rdzv-backend {backend!r}: expected one of {', '.join(RDZV_BACKENDS)}")
    node_rank = _int_option(options, "node_rank", "--node-rank", low=0, cap=MAX_NODES - 1)
    if node_rank is not None and node_rank >= nnodes.max:
        raise UsageError(
            f"bad --node-rank {node_rank}: expected a node rank below --nnodes {nnodes} (0 to {nnodes.max - 1})"
        )
    _int_option(options, "max_restarts", "--max-restarts", low=0, cap=MAX_COUNT)
    _int_option(options, "shutdown_timeout", "--shutdown-timeout", low=1, cap=MAX_SECONDS)
    port = _int_option(options, "master_port", "--master-port", low=1, high=65535)
    interval = options.get("monitor_interval")
    if interval is not None:
        try:
            ok = 0 < float(interval) <= MAX_SECONDS  # False for nan; inf is past the bound
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise UsageError(f"bad --monitor-interval {interval!r}: expected a finite number of seconds > 0, e.g. 0.1")
    check_rdzv_conf(str(options.get("rdzv_conf") or ""))
    role = options.get("role")
    if role is not None and (not str(role).strip() or any(c.isspace() for c in str(role))):
        raise UsageError(f"bad --role {role!r}: expected a non-empty name without spaces")
    handler = options.get("event_log_handler")
    if handler is not None and handler not in EVENT_LOG_HANDLERS:
        raise UsageError(f"bad --event-log-handler {handler!r}: expected one of {', '.join(EVENT_LOG_HANDLERS)}")
    specs = options.get("logs_specs")
    if specs:
        from importlib import metadata

        names = sorted(ep.name for ep in metadata.entry_points().select(group="torchrun.logs_specs"))
        if specs not in names:
            raise UsageError(
                f"bad --logs-specs {specs!r}: expected a 'torchrun.logs_specs' "
                f"entry point ({', '.join(names) or 'none installed'})"
            )
    signals = options.get("signals_to_handle")
    if signals is not None:
        check_signals(str(signals))
    if options.get("log_dir"):
        check_log_dir(str(options["log_dir"]))
    check_redirects(options, nproc=nproc_per_node)
    if port is not None and backend == "static" and not options.get("standalone") and (node_rank or 0) == 0:
        check_port_free(port)


def worker_env(
    plan: LaunchPlan,
    options: LaunchOptions,
    environ: Mapping[str, str],
    *,
    plan_path: str | None,
    no_watch: bool = False,
) -> dict[str, str]:
    """Variables numarun adds to its own environment for torchrun to pass to every worker: the plan (``plan_path``
    None: the plan itself, for a process that becomes the rank), the binding watcher (``no_watch``: off), numarun's
    log level."""
    planned = {k for r in plan.ranks for k in r.env}
    user_set = sorted(k for k in planned if k in environ and k not in DERIVED_ENV)
    env = {**({PLAN_JSON: plan.to_json()} if plan_path is None else {PLAN: plan_path}), USER_ENV: ",".join(user_set)}
    if options.strict_binding:
        env[STRICT_BINDING] = "1"
    # torchrun forces OMP_NUM_THREADS=1 (with a warning) when unset; the bootstrap sets each
    # rank's own value anyway, so pass rank 0's to keep torchrun from overriding it.
    if "OMP_NUM_THREADS" not in environ and plan.ranks and "OMP_NUM_THREADS" in plan.ranks[0].env:
        env["OMP_NUM_THREADS"] = plan.ranks[0].env["OMP_NUM_THREADS"]
    if no_watch:
        env[WATCH_INTERVAL] = "0"
    elif options.watch_interval is not None:  # >= 0: its option type refuses the rest
        env[WATCH_INTERVAL] = f"{options.watch_interval:g}"
    # The binding line of each rank is logged at INFO on purpose (docs/binding.md, "Applied in the worker");
    # an explicit --log-level (or NUMARUN_LOG_LEVEL) sets the workers' level too.
    if options.log_level and LOG_LEVEL not in environ:
        env[LOG_LEVEL] = options.log_level
    return env


def command_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """The equivalent shell command: ``NUMARUN_PLAN=... torchrun ...``."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join([*prefix, shlex.join(["torchrun", *argv])])
