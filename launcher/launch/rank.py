"""Per-rank mode: no torchrun agent (the scheduler started every rank, and signals them); this process,
given the environment torchrun gives its workers (:func:`numarun.jobenv.settle.rank_env`), becomes the
worker in this interpreter: torch is imported once, by the script, after the bootstrap's binding.
What no variable gives, the ranks agree on before the script (:func:`agree`): an MPI launcher does
not say which node a rank is on, and a Hydra app's ranks need one clock for one run dir.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import NoReturn

from ..errors import UsageError
from ..jobenv import JobShape, Scheduler
from .torchrun import Target

AGREE_TIMEOUT_S = 300.0
"""How long the ranks wait for each other before the script starts (they were started together)."""


def become_rank(target: Target, env: Mapping[str, str]) -> NoReturn:
    """Set ``env``, hand logging and standard output back as Python starts them, and run the bootstrap
    on ``target``."""
    os.environ.update(env)
    sys.stdout = sys.__stdout__  # not the CLI's checked stream: the script's writes are its own
    # The CLI configured the root logger for numarun's own lines; a script's logging.basicConfig()
    # must work as under plain python.
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    from ..worker.bootstrap import main

    main(target.bootstrap_args())
    raise SystemExit(0)  # main() ends the process through worker.finish; not reached


def agree(job: JobShape, addr: str, port: int, *, clock: bool) -> tuple[JobShape, str]:
    """The job with the node index and count an MPI launcher leaves out (a host's place among the hosts
    by their lowest rank), and rank 0's clock (ISO time) when ``clock``, else ''. One exchange through
    rank 0 on ``addr:port``, closed before the script opens its store there; none when nothing to agree."""
    hosts_unknown = job.node_index < 0 and job.scheduler is not Scheduler.SLURM
    now = _dt.datetime.now().isoformat() if clock else ""
    if not hosts_unknown and (not clock or job.world_size == 1):
        return job, now
    hosts, now = _exchange(addr, port, rank=job.rank, world_size=job.world_size, host=_node_id(), now=now)
    if hosts_unknown:
        order = list(dict.fromkeys(hosts))
        job = dataclasses.replace(job, nnodes=len(order), node_index=order.index(hosts[job.rank]))
    return job, now


def _node_id() -> str:
    """This node as the exchange tells nodes apart: its hostname and network namespace (nodes that share a
    kernel, as containers and namespaced test nodes do, may share a hostname)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{socket.gethostname()}/{netns}"


def _exchange(addr: str, port: int, *, rank: int, world_size: int, host: str, now: str) -> tuple[list[str], str]:
    """Every rank's host, in rank order, and rank 0's ``now``: each rank sends rank 0 its own, rank 0
    answers every rank with all of them."""
    deadline = time.monotonic() + AGREE_TIMEOUT_S
    try:
        if rank != 0:
            while True:
                try:
                    conn = socket.create_connection((addr, port), timeout=max(1.0, deadline - time.monotonic()))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)  # rank 0 is not listening yet
            with conn, conn.makefile("rw") as f:
                f.write(json.dumps([rank, host]) + "\n")
                f.flush()
                answer = json.loads(f.readline())
            return answer["hosts"], answer["now"]
        dual = socket.has_dualstack_ipv6()
        hosts = [host] + [""] * (world_size - 1)
        with socket.create_server(
            ("", port),
            family=socket.AF_INET6 if dual else socket.AF_INET,
            dualstack_ipv6=dual,
            backlog=min(world_size, 4096),
        ) as server:
            files: list[tuple[socket.socket, io.TextIOWrapper]] = []
            while len(files) < world_size - 1:
                server.settimeout(max(0.1, deadline - time.monotonic()))
                conn, _ = server.accept()
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                f = conn.makefile("rw")
                try:
                    other, name = json.loads(f.readline())
                    if not (isinstance(other, int) and 0 < other < world_size and isinstance(name, str)):
                        raise ValueError(other)
                    hosts[other] = name
                except (OSError, ValueError, TypeError):  # not a rank (a port probe): dropped
                    with conn, f:
                        continue
                files.append((conn, f))
            for conn, f in files:
                with conn, f:
                    f.write(json.dumps({"hosts": hosts, "now": now}) + "\n")
                    f.flush()
        return hosts, now
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(
            f"the ranks could not agree through {addr}:{port} within {AGREE_TIMEOUT_S:.0f} s ({e}); expected "
            "every rank of the job started and rank 0's MASTER_ADDR:MASTER_PORT reachable from each"
        ) from None
