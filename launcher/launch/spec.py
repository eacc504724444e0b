"""The launch as one frozen value: what torchrun is asked to do, built once per job.

The run command resolves the launch options (:mod:`numarun.options.launch`), numarun's planning
decides the rank count, and :func:`launch_spec` turns both into a :class:`LaunchSpec` after checking every option (the
checks that probe the machine, a free port and a writable log dir, run here, once). torchrun's
argv is rendered from the spec (:meth:`LaunchSpec.argv`), and everything numarun needs to know
about the launch (rank count, rendezvous and its deadline, signals, shutdown grace, log dir)
is read from the spec's fields, never back out of the argv.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..argtypes import ONE_NODE, NodeRange, host_port, parse_endpoint
from ..envvars import NODE_KEY, RDZV_MARGIN
from ..errors import UsageError
from ..jobenv.settle import TORCHRUN_DEFAULT_PORT
from ..options.launch import LaunchOptions, option
from .signals import DEATH
from .torchrun import ENTRY_FILE, Target, check_rdzv_conf, check_signals, check_torchrun_options

DEATH_SIGNALS = tuple(s.name for s in DEATH)
"""torchrun's ``--signals-to-handle`` default: numarun ends the run on these."""
_TRUE = ("1", "true", "t", "yes", "y")
C10D_DEFAULT_PORT = 29400
ETCD_DEFAULT_PORT = 2379
"""torch's ports for an endpoint without one (``parse_rendezvous_endpoint``'s ``default_port``)."""
RDZV_MARGIN_S = 15
"""Added to the rendezvous timeout torch was given before numarun stops waiting for it."""

# torchrun options the spec holds as fields, or that numarun replaces
_FIELDS = {
    "nproc_per_node",
    "numa_binding",
    "module",
    "no_python",
    "training_script",
    "training_script_args",
    "help",
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "master_addr",
    "master_port",
    "local_addr",
    "standalone",
    "max_restarts",
    "signals_to_handle",
    "shutdown_timeout",
    "log_dir",
}


@dataclass(frozen=True)
class LaunchSpec:
    """One node's launch: torchrun's options as numarun decided them."""

    target: Target
    nproc_per_node: int
    nnodes: NodeRange = ONE_NODE
    node_rank: int = 0
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_id: str = "none"
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    master_addr: str | None = None
    master_port: int | None = None
    local_addr: str | None = None
    standalone: bool = False
    max_restarts: int = 0
    death_signals: tuple[str, ...] = DEATH_SIGNALS
    shutdown_timeout: int | None = None
    """Seconds between TERM and KILL for the workers; None: torchrun's (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` or 30)."""
    log_dir: str | None = None
    """The user's ``--log-dir``; None: numarun's private directory (see :meth:`argv`)."""
    passthrough: tuple[tuple[str, str], ...] = field(default=())
    """Other torchrun options, ``("--redirects", "3")``, rendered as given."""
    rdzv_margin_s: int = RDZV_MARGIN_S
    """Seconds numarun waits past torch's rendezvous timeout (``NUMARUN_RDZV_MARGIN``)."""
    hosts_store: bool = True
    """Whether this node hosts the rendezvous store (an etcd server: none does); one that does not waits for it
    to listen first (:attr:`waits_for_store`)."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables the address rule gives the workers (:mod:`numarun.launch.net`)."""
    node_key: tuple[str, ...] = ()
    """What this node reports to a dynamic (c10d) rendezvous so that node ranks follow the nodes' keys (a layout's
    node order: :func:`rendezvous_key`); () torch's own order, by address."""

    # --- what numarun reads from the launch ---
    @property
    def multi_node(self) -> bool:
        return self.nnodes.max > 1 and not self.standalone

    @property
    def backend(self) -> str:
        """The rendezvous backend torchrun will use (``--standalone`` is c10d on localhost)."""
        return "c10d" if self.standalone else self.rdzv_backend

    def rendezvous_deadline(self) -> tuple[int, str]:
        """(seconds, what they come from) that one rendezvous may take: torch's own timeout
        (``join_timeout`` for c10d/etcd, ``timeout`` for static) plus :data:`RDZV_MARGIN_S`."""
        key, default = ("timeout", 900) if self.backend == "static" else ("join_timeout", 600)
        base = int(dict(self.rdzv_conf).get(key, default))
        return base + self.rdzv_margin_s, f"{key}={base} + {self.rdzv_margin_s} s"

    def endpoint(self) -> tuple[str, int]:
        """(host, port) of the rendezvous store (``--standalone``: localhost, on a port torch picks)."""
        if self.standalone:
            return "localhost", 0
        if self.backend == "static":
            return self.master_addr or "127.0.0.1", self.master_port or TORCHRUN_DEFAULT_PORT
        host, port = parse_endpoint(self.rdzv_endpoint or "localhost", "--rdzv-endpoint")
        return host, port or (ETCD_DEFAULT_PORT if self.backend.startswith("etcd") else C10D_DEFAULT_PORT)

    @property
    def waits_for_store(self) -> bool:
        """Whether numarun waits, quietly, for the rendezvous store before torchrun starts (torch's C++ client
        retries aloud): another node's c10d or static store, or an etcd server."""
        return not self.hosts_store and (self.multi_node or self.backend.startswith("etcd"))

    def store_address(self) -> tuple[str, int] | None:
        """(host, port) of the store a multi-node rendezvous creates on the head; None for one node."""
        return self.endpoint() if self.multi_node else None

    def endpoint_text(self) -> str:
        """Where the rendezvous happens, for messages."""
        return host_port(*self.endpoint())

    def node_label(self) -> str | None:
        """This node's name in a multi-node job's run dir (None for one node): ``node<rank>`` under a
        static rendezvous, where the rank is fixed; else host and pid (ranks come at rendezvous)."""
        if self.nnodes == ONE_NODE:
            return None
        if self.rdzv_backend == "static":
            return f"node{self.node_rank}"
        return f"{socket.gethostname()}.{os.getpid()}"

    # --- torchrun's argv, rendered ---
    def argv(self, *, log_dir: str | None = None) -> list[str]:
        """torchrun's argv (without the program name). ``log_dir``: torchelastic's logs when the user
        gave none (numarun's private directory, removed with it)."""
        out = [f"--nproc-per-node={self.nproc_per_node}"]
        for flag, value, default in (  # a value "" is the flag alone
            ("--nnodes", self.nnodes, ONE_NODE),
            ("--node-rank", self.node_rank, 0),
            ("--standalone", "" if self.standalone else None, None),
            ("--rdzv-backend", self.rdzv_backend, "static"),
            ("--rdzv-endpoint", self.rdzv_endpoint, ""),
            ("--rdzv-id", self.rdzv_id, "none"),
            ("--master-addr", self.master_addr, None),
            ("--master-port", self.master_port, None),
            ("--local-addr", self.local_addr, None),
            ("--max-restarts", self.max_restarts, 0),
            ("--shutdown-timeout", self.shutdown_timeout, None),
            ("--rdzv-conf", ",".join(f"{k}={v}" for k, v in self.rdzv_conf), ""),
            ("--signals-to-handle", ",".join(self.death_signals), ",".join(DEATH_SIGNALS)),
            ("--log-dir", self.log_dir or log_dir or None, None),
            *((flag, value, None) for flag, value in self.passthrough),
        ):
            if value is not None and value != default:
                out.append(f"{flag}={value}" if value != "" else flag)
        return [*out, ENTRY_FILE, *self.target.bootstrap_args()]


def launch_spec(options: LaunchOptions, *, nproc_per_node: int, target: Target, nics: Sequence[str] = ()) -> LaunchSpec:
    """Check every torchrun option once, and build the spec with the address rule applied
    (:func:`numarun.launch.net.addressing`; ``nics``: the plan's, preferred). numarun's options are read as they
    are typed; torchrun's others as a source stated them (torchrun's defaults stand for the rest)."""
    stated = {d: s.value for d, s in options.stated().items()}
    check_torchrun_options(stated, nproc_per_node=nproc_per_node)
    passthrough = []
    for dest, value in stated.items():  # in the order of torchrun's options
        o = option(dest)
        if o.owner == "numarun" or dest in _FIELDS:
            continue
        if not o.switch:  # torchrun's comma_separated_list reads ",," as a literal comma
            listed = isinstance(value, (list, tuple))
            passthrough.append((o.flag, ",".join(str(v).replace(",", ",,") for v in value) if listed else str(value)))
        elif value:
            passthrough.append((o.flag, ""))

    def host(dest: str) -> str | None:
        value = stated.get(dest)
        return None if not value else parse_endpoint(str(value), "--" + dest.replace("_", "-"), port=False)[0]

    conf = check_rdzv_conf(str(stated.get("rdzv_conf") or ""))
    spec = LaunchSpec(
        target=target,
        nproc_per_node=nproc_per_node,
        nnodes=options.nnodes,
        node_rank=options.node_rank or 0,
        rdzv_backend=options.rdzv_backend or "static",
        rdzv_endpoint=host_port(*parse_endpoint(options.rdzv_endpoint, "--rdzv-endpoint"))
        if options.rdzv_endpoint
        else "",
        rdzv_id=options.rdzv_id or "none",
        rdzv_conf=tuple(conf.items()),
        master_addr=host("master_addr"),  # torchrun's default (127.0.0.1) is its own to apply
        master_port=options.master_port,
        local_addr=host("local_addr"),
        standalone=options.standalone,
        max_restarts=int(stated.get("max_restarts") or 0),
        death_signals=check_signals(str(stated["signals_to_handle"]))
        if "signals_to_handle" in stated
        else DEATH_SIGNALS,
        shutdown_timeout=int(stated["shutdown_timeout"]) if stated.get("shutdown_timeout") is not None else None,
        log_dir=str(stated["log_dir"]) if stated.get("log_dir") else None,
        passthrough=tuple(passthrough),
        rdzv_margin_s=rdzv_margin(os.environ),
    )
    from .net import addressing

    is_host = conf.get("is_host")
    a = addressing(
        multi_node=spec.multi_node,
        backend=spec.backend,
        endpoint=spec.endpoint(),
        node_rank=spec.node_rank,
        flag="--master-addr" if spec.backend == "static" else "--rdzv-endpoint",
        prefer=nics,
        given_local_addr=spec.local_addr,
        given_is_host=None if is_host is None else is_host.lower() in _TRUE,
    )
    advertise = not spec.multi_node or spec.backend != "static"  # static: torchrun ignores --local-addr
    if advertise and a.local_addr is None:
        raise UsageError(
            "no address for the other nodes to reach (only loopback or link-local); expected --local-addr ADDR"
        )
    if a.is_host is not None and is_host is None:
        conf["is_host"] = "true" if a.is_host else "false"
    return dataclasses.replace(
        spec,
        local_addr=a.local_addr if advertise else spec.local_addr,
        rdzv_conf=tuple(conf.items()),
        hosts_store=a.hosts_store,
        env=a.env,
    )


def rdzv_margin(environ: Mapping[str, str]) -> int:
    """:data:`RDZV_MARGIN_S`, or the whole seconds in ``NUMARUN_RDZV_MARGIN`` (0 to 3600)."""
    text = environ.get(RDZV_MARGIN, "").strip()
    if not text:
        return RDZV_MARGIN_S
    if not text.isdigit() or int(text) > 3600:
        raise UsageError(f"bad {RDZV_MARGIN} {text!r}: expected whole seconds from 0 to 3600")
    return int(text)


def rendezvous_key(*, nvlink_domain: str, position: int | None, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The key a node reports to a c10d rendezvous with a layout: its multi-node NVLink domain, the user's
    ``NUMARUN_NODE_KEY``, its place in Slurm's node order (regrouped by leaf switch); nodes then take node ranks
    in key order (equal keys: torch's order), so that a domain's or a switch's nodes get adjacent node ranks."""
    return (nvlink_domain, environ.get(NODE_KEY, "").strip(), f"{position:09d}" if position is not None else "")
