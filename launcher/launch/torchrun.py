"""A LaunchPlan handed to torchrun: the option parser, the argv as data, and the run.

``numarun [run] [torchrun options] SCRIPT|-m MODULE [args...]`` parses torchrun's own
options with torchrun's own parser (``torch.distributed.run.get_args_parser``, so every
spelling torchrun accepts is accepted), adds numarun's, and calls
``torch.distributed.run.main(argv)`` with an argv whose entrypoint is this package's
worker bootstrap::

    torchrun --nproc-per-node=2 ... <numarun>/launch/entry.py [--module] SCRIPT ARGS...

Rendezvous, restarts, log redirection and signal forwarding stay torchrun's. The argv is
built first as a value (:func:`build_torchrun_argv`) so ``--dry-run`` prints exactly
what would run.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shlex
import shutil
import signal
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..argtypes import MAX_COUNT, MAX_NODES, MAX_SECONDS
from ..envvars import LAUNCHER_PID, USER_ENV
from ..envvars import PLAN as PLAN_ENV
from ..envvars import STATE_DIR as STATE_ENV
from ..envvars import STRICT_BINDING as STRICT_ENV
from ..errors import NumarunError, UsageError
from ..plan.model import LaunchPlan

log = logging.getLogger(__name__)

ENTRY_FILE = str(Path(__file__).resolve().with_name("entry.py"))
"""The worker entry point, run by path so that nothing on ``sys.path`` can shadow it."""

# torchrun options numarun replaces or cannot honour.
_REPLACED = {"nproc_per_node", "numa_binding", "module", "no_python", "training_script", "training_script_args", "help"}


_FOR_HELP = False
"""Set by the CLI for a help screen: :func:`torchrun_parser` may then skip importing torch."""


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own parser (imports torch); for a help screen, its recorded copy when it fits."""
    if _FOR_HELP:
        from .torchrun_options import help_parser

        recorded = help_parser()
        if recorded is not None:
            return recorded
    from .startup import import_torchrun

    return import_torchrun().get_args_parser()


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """numarun's own ``run`` options, next to torchrun's and the planning ones."""
    group = parser.add_argument_group("numarun")
    group.add_argument("--dry-run", action="store_true", help="print the plan and the equivalent torchrun command; run nothing")
    group.add_argument(
        "--strict-binding", action="store_true",
        help=f"a rank whose binding cannot be applied fails instead of running unbound (sets {STRICT_ENV}=1)",
    )
    group.add_argument(
        "--plan-file", metavar="PATH", default=None, help="use this saved plan ('numarun plan --json' output) instead of planning"
    )


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


def target_from_args(args: argparse.Namespace) -> Target:
    """The user's program from torchrun's positional/flag options; checks it exists."""
    if getattr(args, "run_path", False):
        raise UsageError("bad option '--run-path': numarun runs each worker in its own process to bind it; expected it left out")
    if getattr(args, "virtual_local_rank", False):
        raise UsageError("bad option '--virtual-local-rank': every rank would read local rank 0's binding; expected it left out")
    name = args.training_script
    script_args = tuple(args.training_script_args)
    if args.module and args.no_python:
        raise UsageError("bad options '--module' with '--no-python': expected at most one of them")
    if args.module:
        check_module(name)
        return Target("module", name, script_args)
    if args.no_python:
        if shutil.which(name) is None:
            raise UsageError(f"bad program {name!r}: not found or not executable; expected a program on PATH or a path to one")
        return Target("exec", name, script_args)
    if not os.path.isfile(name):
        raise UsageError(f"bad script {name!r}: no such file; expected a path to a Python script (or -m MODULE)")
    return Target("script", name, script_args)


def check_module(name: str) -> None:
    """``-m MODULE`` must be importable as the workers will import it (the working directory
    first on the path, as ``python -m`` puts it)."""
    import importlib.util
    import sys

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
RDZV_INT_KEYS = ("timeout", "join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout",
                 "read_timeout", "keep_alive_interval", "keep_alive_max_attempt")
RDZV_BOOL_KEYS = ("is_host",)
RDZV_STR_KEYS = ("store_type", "protocol", "cert", "key", "cacert", "ssl_cert", "ssl_cert_key", "ca_cert", "etcd_prefix")
_BOOL_WORDS = ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
# torch.distributed.elastic.events handlers
EVENT_LOG_HANDLERS = ("console", "dynamic_rendezvous", "null")


def _int_option(options: Mapping[str, Any], dest: str, flag: str, *, low: int, high: int | None = None,
                cap: int | None = None) -> int | None:
    value = options.get(dest)
    if value is None:
        return None
    text = str(value).strip()
    form = f"a whole number >= {low} (at most {cap})" if high is None else f"a whole number from {low} to {high}"
    top = high if high is not None else cap
    if not text.lstrip("-").isdigit() or not (low <= int(text) and (top is None or int(text) <= top)):
        raise UsageError(f"bad {flag} {text!r}: expected {form}")
    return int(text)


def parse_endpoint(endpoint: str, *, flag: str = "--rdzv-endpoint") -> tuple[str, int | None]:
    """``host[:port]`` / ``[v6]:port`` -> (host, port or None); refuses a port that is not 1-65535."""
    text = endpoint.strip()
    form = "HOST or HOST:PORT with PORT from 1 to 65535 (IPv6 as [ADDR]:PORT), e.g. node0:29400"
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise UsageError(f"bad {flag} {endpoint!r}: expected {form}")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:  # a bare IPv6 address
        host, port_text = text, None
    else:
        host, port_text = text, None
    if not host or any(c.isspace() for c in host):
        raise UsageError(f"bad {flag} {endpoint!r}: expected {form}")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(f"bad {flag} {endpoint!r}: port {port_text!r} is not a number from 1 to 65535; expected {form}")
    return host, int(port_text)


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
            if not value.isdigit() or not 1 <= int(value) <= MAX_SECONDS:  # torch passes it to C as an int
                raise UsageError(
                    f"bad --rdzv-conf {conf!r}: {key}={value!r} is not a whole number of seconds from 1 to {MAX_SECONDS}; "
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
            raise UsageError(f"bad --signals-to-handle {text!r}: {n!r} is not a signal that can be handled; expected {form}")
    return names


def check_log_dir(path: str) -> None:
    """An existing writable directory, or a path whose nearest existing parent is one."""
    p = Path(path)
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
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
    from torch.distributed.elastic.multiprocessing.api import Std

    for dest, flag in (("redirects", "--redirects"), ("tee", "--tee")):
        value = options.get(dest)
        if value is None or value == "0":
            continue
        try:
            Std.from_str(str(value))
        except (ValueError, KeyError, TypeError):
            raise UsageError(
                f"bad {flag} {value!r}: expected 0-3 (none, stdout, stderr, both) or LOCAL_RANK:0-3,... e.g. 3 or 0:1,1:2"
            ) from None
    ranks = str(options.get("local_ranks_filter") or "")
    if ranks:
        parts = [r.strip() for r in ranks.split(",")]
        if not all(r.isdigit() for r in parts) or (nproc is not None and any(int(r) >= nproc for r in parts)):
            below = f" below {nproc}" if nproc is not None else ""
            raise UsageError(f"bad --local-ranks-filter {ranks!r}: expected comma-separated local ranks{below}, e.g. 0,1")


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
    ``--node-rank`` (below the node count), ``--rdzv-backend``, ``--rdzv-endpoint``,
    ``--rdzv-conf`` (known keys, typed values), ``--max-restarts``, ``--monitor-interval``,
    ``--master-port`` (and free on node 0 of a static rendezvous), ``--local-addr``,
    ``--log-dir``, ``--redirects``/``--tee``, ``--local-ranks-filter``, ``--signals-to-handle``,
    ``--shutdown-timeout``, ``--event-log-handler``, ``--logs-specs``, ``--role``.
    """
    nnodes = str(options.get("nnodes", "1"))
    parts = nnodes.split(":")
    form = f"N or MIN:MAX with 1 <= MIN <= MAX <= {MAX_NODES}, e.g. 2 or 1:4"
    if len(parts) > 2 or not all(p.strip().isdigit() and len(p.strip()) <= 30 for p in parts):
        raise UsageError(f"bad --nnodes {nnodes!r}: expected {form}")
    low, high = int(parts[0]), int(parts[-1])
    if not 1 <= low <= high <= MAX_NODES:
        raise UsageError(f"bad --nnodes {nnodes!r}: expected {form}")
    backend = options.get("rdzv_backend", "static")
    if backend not in RDZV_BACKENDS:
        raise UsageError(f"bad --rdzv-backend {backend!r}: expected one of {', '.join(RDZV_BACKENDS)}")
    node_rank = _int_option(options, "node_rank", "--node-rank", low=0, cap=MAX_NODES - 1)
    if node_rank is not None and node_rank >= high:
        raise UsageError(f"bad --node-rank {node_rank}: expected a node rank below --nnodes {nnodes} (0 to {high - 1})")
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
    endpoint = str(options.get("rdzv_endpoint") or "")
    if endpoint:
        parse_endpoint(endpoint)
    check_rdzv_conf(str(options.get("rdzv_conf") or ""))
    for dest, flag in (("master_addr", "--master-addr"), ("role", "--role")):
        value = options.get(dest)
        if value is not None and (not str(value).strip() or any(c.isspace() for c in str(value))):
            raise UsageError(f"bad {flag} {value!r}: expected a non-empty name without spaces")
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
    if options.get("local_addr"):
        from .net import resolve

        resolve(str(options["local_addr"]), flag="--local-addr")
    if port is not None and backend == "static" and not options.get("standalone") and (node_rank or 0) == 0:
        check_port_free(port)


def _option_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        # torchrun's comma_separated_list reads ",," as a literal comma
        return ",".join(str(v).replace(",", ",,") for v in value)
    return str(value)


def build_torchrun_argv(
    options: Mapping[str, Any], *, nproc_per_node: int, target: Target, parser: argparse.ArgumentParser | None = None
) -> list[str]:
    """torchrun's argv (without the program name) for ``options`` (torchrun dests -> values).

    An option is written, in its first long spelling, only when it differs from
    torchrun's default; ``--nproc-per-node`` is always the plan's rank count. The
    entrypoint is the worker entry file (:mod:`numarun.launch.entry`) with the user's
    target behind it.
    """
    parser = parser or torchrun_parser()
    check_torchrun_options(options, nproc_per_node=nproc_per_node)
    argv = [f"--nproc-per-node={nproc_per_node}"]
    for action in parser._actions:  # noqa: SLF001  (torchrun exposes no other listing)
        if not action.option_strings or action.dest in _REPLACED or action.dest not in options:
            continue
        value = options[action.dest]
        if value == action.default or value is None:
            continue
        spelling = next(s for s in action.option_strings if s.startswith("--"))
        if action.nargs == 0:
            if value:
                argv.append(spelling)
        else:
            argv.append(f"{spelling}={_option_text(value)}")
    argv += [ENTRY_FILE, *target.bootstrap_args()]
    return argv


def worker_env(plan: LaunchPlan, environ: Mapping[str, str], *, plan_path: str, strict: bool) -> dict[str, str]:
    """Variables numarun adds to its own environment for torchrun to pass to every worker."""
    planned = {k for r in plan.ranks for k in r.env}
    user_set = sorted(k for k in planned if k in environ)
    env = {PLAN_ENV: plan_path, USER_ENV: ",".join(user_set)}
    if strict:
        env[STRICT_ENV] = "1"
    # torchrun forces OMP_NUM_THREADS=1 (with a warning) when unset; the bootstrap sets each
    # rank's own value anyway, so pass rank 0's to keep torchrun from overriding it.
    if "OMP_NUM_THREADS" not in environ and plan.ranks and "OMP_NUM_THREADS" in plan.ranks[0].env:
        env["OMP_NUM_THREADS"] = plan.ranks[0].env["OMP_NUM_THREADS"]
    return env


def command_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """The equivalent shell command: ``NUMARUN_PLAN=... torchrun ...``."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join([*prefix, shlex.join(["torchrun", *argv])])


# Removes numarun's private directory, and ends the workers' process groups, once numarun
# is gone however it went (SIGKILL included): it blocks reading a pipe whose only writer is
# numarun, so EOF means numarun has exited. Started with -I -S: nothing of the user's loads.
_CLEANER = r"""
import os, shutil, signal, sys
sys.stdin.buffer.read()
d = sys.argv[1]
try:
    names = os.listdir(d)
except OSError:
    names = []
for n in names:
    if n.startswith("pid."):
        try:
            os.killpg(int(open(os.path.join(d, n)).read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
shutil.rmtree(d, ignore_errors=True)
"""

_state: dict[str, Any] = {}


def state_dir() -> Path:
    """numarun's private directory (0700) for this process: the plan file when there is no run
    dir, and what workers record (their pid, their exit). Removed on every exit path: by an
    atexit handler, and by a small cleaner process when numarun dies without running it
    (SIGKILL, a signal with no handler)."""
    if "dir" not in _state:
        import subprocess
        import sys

        directory = tempfile.mkdtemp(prefix="numarun-")
        cleaner = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CLEANER, directory],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        _state.update(dir=directory, cleaner=cleaner)

        def _cleanup() -> None:
            shutil.rmtree(directory, ignore_errors=True)  # first: the cleaner then finds no pids
            assert cleaner.stdin is not None
            cleaner.stdin.close()
            try:
                cleaner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                cleaner.kill()

        atexit.register(_cleanup)
    return Path(_state["dir"])


def write_plan_file(plan: LaunchPlan, run_dir: os.PathLike[str] | str | None = None, *, node: str | None = None) -> Path:
    """The plan as a file (mode 0600) for this node's workers; returns its path.

    Always in numarun's private directory (0700, :func:`state_dir`, removed when numarun
    exits): a run dir is shared by every node of a job on a shared filesystem, and a plan
    there would be read by the workers of whichever node wrote it last. With ``run_dir``
    a copy is kept there as the record of how the job ran: ``numarun_plan.json``, or
    ``numarun_plan.<node>.json`` on a job of several nodes.
    """
    from ..fsutil import write_atomic

    text = plan.to_json()
    path = state_dir() / "plan.json"
    path.unlink(missing_ok=True)  # the next job of a sweep
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if run_dir is not None:
        record = Path(run_dir) / ("numarun_plan.json" if node is None else f"numarun_plan.{node}.json")
        write_atomic(record, text, mode=0o600)
    return path


def node_label(options: Mapping[str, Any]) -> str | None:
    """This node's name in a multi-node job's run dir (None for one node): ``node<rank>``
    under a static rendezvous, where the rank is fixed; else host and pid (ranks are
    assigned only at rendezvous)."""
    nnodes = str(options.get("nnodes") or "1")
    if nnodes in ("1", "1:1"):
        return None
    if options.get("rdzv_backend", "static") == "static" and options.get("node_rank") is not None:
        return f"node{options['node_rank']}"
    return f"{socket.gethostname()}.{os.getpid()}"


def options_endpoint(argv: Sequence[str]) -> str:
    """The ``--rdzv-endpoint`` value in a torchrun argv ('' when absent)."""
    for a in argv:
        if a.startswith("--rdzv-endpoint="):
            return a.split("=", 1)[1]
    return ""


def failure_cause(failure: Any) -> str:
    """``ValueError: boom`` from a failed worker's torchelastic error file ('' when it wrote none)."""
    message = getattr(failure, "message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    if not isinstance(message, str) or not message or message.startswith(("To enable traceback", "Signal ")):
        return ""  # torchelastic's own placeholder: the worker wrote no error file
    return message.splitlines()[0]


class RunFailed(NumarunError):
    """A worker failed (its exit code is the run's) or numarun was stopped by a signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# torchrun's death signals (its --signals-to-handle default). torchrun installs its handler
# only when the workers start; numarun installs the same one first, so a signal during
# rendezvous ends the run the same way (one line, 128+N, the private directory removed).
DEATH_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
FORWARDED = ("SIGUSR1", "SIGUSR2")
"""Sent on to every worker (the trainer checkpoints and exits 0); numarun waits for the workers."""


def _argv_value(argv: Sequence[str], spelling: str, default: str) -> str:
    for a in argv:
        if a.startswith(spelling + "="):
            return a.split("=", 1)[1]
    return default


def live_workers(state: Path) -> list[int]:
    """Pids of this numarun's workers (recorded by the bootstrap, still our children)."""
    import psutil

    children = {c.pid for c in psutil.Process().children()}
    pids = []
    for f in state.glob("pid.*"):
        try:
            pid = int(f.read_text())
        except (OSError, ValueError):
            continue
        if pid in children:
            pids.append(pid)
    return sorted(pids)


def _forward(signum: int, frame: Any) -> None:
    state = _state.get("dir")
    pids = live_workers(Path(state)) if state else []
    log.warning("got %s: sending it to %d worker(s)", signal.Signals(signum).name, len(pids))
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def stopped_cleanly(state: Path, nproc: int) -> bool:
    """Whether every local rank of the latest worker group recorded exit code 0."""
    records = []
    for f in state.glob("exit.*"):
        try:
            restart, code = (int(x) for x in f.read_text().split())
        except (OSError, ValueError):
            return False
        records.append((restart, code))
    if not records:
        return False
    latest = max(r for r, _ in records)
    return sum(1 for r, c in records if r == latest and c == 0) == nproc


SIGNAL_GRACE_S = 5.0
"""How long a death signal may wait for Python code to see it before numarun ends anyway."""


def _watch_signals(death: set[int], state: Path) -> Any:
    """End numarun when a death signal arrives while its main thread is stuck in C++.

    Python runs signal handlers only between bytecodes of the main thread; torch's rendezvous
    waits inside C++ (a TCPStore wait) and would not see SIGTERM until its own timeout. The
    signal module's wakeup fd is written by the C-level handler at once, so a thread reading
    it learns of the signal; if no worker is running and run_torchrun has not reported the
    signal within :data:`SIGNAL_GRACE_S`, it prints the same line and exits 128 + N.
    Returns a function that stops the watch.
    """
    import sys
    import threading
    import time

    r, w = os.pipe()
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def loop() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in death:
                    continue
                time.sleep(SIGNAL_GRACE_S)
                if _state.get("reported") or live_workers(state):
                    continue
                print(f"numarun: error: stopped by {signal.Signals(signum).name}; no worker was running",
                      file=sys.stderr, flush=True)
                shutil.rmtree(state, ignore_errors=True)
                os._exit(128 + signum)

    threading.Thread(target=loop, name="numarun-signals", daemon=True).start()

    def stop() -> None:
        signal.set_wakeup_fd(old)
        os.close(w)

    return stop


RDZV_MARGIN_S = 15
"""Added to the rendezvous timeout torch was given before numarun stops waiting for it."""


def rendezvous_deadline(argv: Sequence[str]) -> tuple[int, str]:
    """(seconds, what they come from) that the first rendezvous may take: torch's own timeout
    (``join_timeout`` for c10d/etcd, ``timeout`` for static) plus :data:`RDZV_MARGIN_S`."""
    conf = check_rdzv_conf(_argv_value(argv, "--rdzv-conf", ""))
    backend = _argv_value(argv, "--rdzv-backend", "static")
    if "--standalone" in argv:
        backend = "c10d"
    key, default = ("timeout", 900) if backend == "static" else ("join_timeout", 600)
    base = int(conf.get(key, default))
    return base + RDZV_MARGIN_S, f"{key}={base} + {RDZV_MARGIN_S} s"


def _watch_rendezvous(argv: Sequence[str], state: Path) -> Any:
    """A deadline on the first rendezvous: torch's c10d client waits without end on an endpoint
    where another program listens. When no worker has started by the deadline, numarun
    prints one line naming it and exits 1. Returns a function that disarms it."""
    import sys
    import threading

    seconds, source = rendezvous_deadline(argv)
    done = threading.Event()

    def wait() -> None:
        if done.wait(seconds) or list(state.glob("pid.*")):
            return
        endpoint = options_endpoint(argv) or _argv_value(argv, "--master-addr", "127.0.0.1")
        print(f"numarun: error: rendezvous did not complete within {seconds} s ({source}) at {endpoint!r}; "
              "expected every node to join and the rendezvous store at that endpoint (is another program "
              "listening on it?)", file=sys.stderr, flush=True)
        shutil.rmtree(state, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=wait, name="numarun-rendezvous", daemon=True).start()
    return done.set


def run_torchrun(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """``torch.distributed.run.main(argv)`` with ``env`` added; failures become :class:`RunFailed`.

    A failed run exits with the exit code of the lowest global rank that exited non-zero
    (1 when every failed rank died from a signal). Signals to numarun:

    * SIGTERM, SIGINT, SIGHUP, SIGQUIT (``--signals-to-handle``): sent on to every worker,
      which gets torchrun's 30 s (``--shutdown-timeout``) before SIGKILL. When every worker
      then exits 0 on its own (the trainer's checkpoint-and-stop) the run is a clean stop:
      one line, exit 0. Otherwise one error line and exit 128 + N. During rendezvous: 128 + N.
    * SIGUSR1, SIGUSR2: sent on to every worker; numarun keeps waiting, and the run's result is
      the workers' (the trainer checkpoints and exits 0; a script without a handler dies).
    * SIGKILL: workers die with it (each has a parent-death signal), their process groups are
      ended and the private directory is removed by the cleaner process.
    """
    import sys

    from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    from . import startup

    startup.install()
    state = state_dir()
    for f in [*state.glob("exit.*"), *state.glob("pid.*")]:
        f.unlink(missing_ok=True)  # the previous job of a sweep
    nproc = int(_argv_value(argv, "--nproc-per-node", "1"))
    death = [n.strip() for n in _argv_value(argv, "--signals-to-handle", ",".join(DEATH_SIGNALS)).split(",") if n.strip()]
    previous = {}
    for name in {*death, *FORWARDED}:
        sig = getattr(signal, name)
        previous[sig] = signal.signal(sig, _terminate_process_handler if name in death else _forward)
    _state["reported"] = False
    stop_watch = _watch_signals({int(getattr(signal, n)) for n in death}, state)
    stop_rdzv = _watch_rendezvous(argv, state)
    # Restored afterwards: a sweep runs several jobs from one numarun, and a variable left
    # by one job (torchrun's OMP_NUM_THREADS too) must not look user-set to the next.
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ.update({LAUNCHER_PID: str(os.getpid()), STATE_ENV: str(state)})
    # torchrun's default log dir (torchelastic_*, the workers' error files) goes inside the
    # private directory, so it is removed with it.
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(state)
    try:
        torchrun_main(list(argv))
    except ChildFailedError as e:
        parts = []
        for rank in sorted(e.failures):
            failure = e.failures[rank]
            how = f"exited with code {failure.exitcode}" if failure.exitcode >= 0 else f"was killed by {failure.signal_name()}"
            cause = failure_cause(failure)
            who = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid})"
            parts.append(f"{who} failed: {cause} ({how})" if cause else f"{who} {how}")
        # Ranks torchrun itself stopped after the first failure show up killed by a signal:
        # the run's code is that of the lowest rank that exited on its own.
        codes = [e.failures[r].exitcode for r in sorted(e.failures) if e.failures[r].exitcode > 0]
        raise RunFailed("; ".join(parts), codes[0] if codes else 1) from None
    except RendezvousError as e:
        # A node (or the one hosting the c10d store) went away, or the endpoint is unreachable.
        first = str(e).splitlines()[0] if str(e) else ""
        raise RunFailed(
            f"rendezvous failed: {type(e).__name__}: {first} (a node was lost or the rendezvous endpoint "
            f"{options_endpoint(argv)!r} is unreachable); expected every node to stay up and reach it",
            1,
        ) from None
    except SignalException as e:
        _state["reported"] = True
        sig = signal.Signals(e.sigval)
        if stopped_cleanly(state, nproc):
            print(f"numarun: stopped by {sig.name}: every worker finished cleanly", file=sys.stderr, flush=True)
            return
        raise RunFailed(f"stopped by {sig.name}; all workers were ended", 128 + int(sig)) from None
    except (RuntimeError, ValueError, OSError) as e:
        # torchrun's own runtime failures (a taken port, a store that cannot be reached...):
        # one line naming the cause instead of its traceback.
        raise RunFailed(f"torchrun failed: {runtime_cause(e)}", 1) from None
    finally:
        stop_rdzv()
        stop_watch()
        tempfile.tempdir = saved_tempdir
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(saved)


def runtime_cause(e: BaseException) -> str:
    """``Type: first line`` of an exception, with the endpoint a network error names."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    # c10d's errors put the cause last: "... The server socket has failed to listen on any local
    # network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    for line in lines:
        if "EADDRINUSE" in line or "address already in use" in line:
            text = f"{text} (address already in use)"
            break
    return f"{type(e).__name__}: {text}"
