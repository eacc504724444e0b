"""The doctor across nodes: every node reports to node rank 0 through a c10d ``TCPStore``
(no process group is initialised, so no backend or GPU is needed), and the nodes measure
their links pairwise over plain TCP streams.

Sequence (keys under ``numarun-doctor/``); a node other than 0 makes a bounded number of
store requests whatever the node count (no key of every node is read or waited for), node 0
a number in proportion to it, so the store serves O(N) requests in all:

1. node 0 draws the seed of the schedule and publishes it with the schedule's name (``plan``);
   each node starts a stream server on the address it reaches node 0 from and publishes it;
2. the first rounds (:func:`~.schedule.first_rounds`): in each pair, once both ends are ready
   for the round, the lower rank streams to the higher for ``seconds``, then the other way; the
   receiver times from the first byte to the end of the stream and keeps its best figure per
   sender; a node reads only its peers' keys;
3. ``bounded`` only, up to the bound: each node publishes its figures so far; node 0 gathers
   them, plans the next round (:func:`~.schedule.next_round`: suspects against known-good nodes)
   and gives each node its peer, or "stop" when nothing is in doubt (one key each); the round
   runs as the first ones did;
4. each node publishes its report (findings, facts, received figures);
5. node 0 gathers the reports, judges and publishes the verdict without the per-node detail
   (its size grows with the faults found, not with the node count); the others read it and
   acknowledge, and node 0 closes the store only after every acknowledgement.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from ..argtypes import host_port, parse_endpoint
from ..errors import DoctorError, UsageError
from ..launch.net import await_endpoint, route_address, scoped_address, sockaddr
from .compare import compare_nodes, link_verdict, odd_nodes
from .model import Finding, NodeReport, Severity, has_error, sort_findings
from .schedule import LinkSchedule, first_rounds, next_round, resolve

log = logging.getLogger(__name__)

PREFIX = "numarun-doctor/"
CHUNK = 256 << 10


class TcpLink(threading.Thread):
    """This node's end of the link measurements, over plain TCP streams: node ``rank``'s stream server, which accepts
    one stream at a time and records GB/s per sending node rank in ``received`` (the best, if several), and its
    streams of ``seconds`` to the peers (:meth:`stream` returns once the peer has every byte)."""

    def __init__(self, host: str, rank: int, seconds: float) -> None:
        super().__init__(daemon=True, name="numarun-doctor-streams")
        family, addr = sockaddr(host, 0)  # a link-local host keeps its scope (fe80::1%eth0)
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(addr)
        self.sock.listen(8)
        self.received: dict[int, float] = {}
        self.rank, self.seconds = rank, seconds

    @property
    def address(self) -> str:
        """host:port where the peers stream to this node."""
        name = self.sock.getsockname()
        # link-local: the peers reach it through the interface of that name
        return host_port(scoped_address(name), int(name[1]))

    def stream(self, peer_address: str, peer: int) -> None:
        _stream_to(peer_address, self.rank, self.seconds)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    head = conn.recv(4, socket.MSG_WAITALL)
                    if len(head) < 4:
                        raise OSError("stream closed early")
                    sender = struct.unpack("!i", head)[0]
                    buf = bytearray(CHUNK)
                    n = total = conn.recv_into(buf)
                    t0 = time.perf_counter()  # timed from the first byte to the end of the stream
                    while n:
                        n = conn.recv_into(buf)
                        total += n
                    dt = time.perf_counter() - t0
                    gbs = round(total / dt / 1e9, 4) if dt > 0 else 0.0
                    # a pair measured again (a re-test) keeps its best figure: a transient dip is not a fault
                    self.received[sender] = max(gbs, self.received.get(sender, 0.0))
                    conn.sendall(b"k")
                except OSError as e:
                    log.warning("doctor stream failed: %s", e)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _stream_to(addr: str, my_rank: int, seconds: float) -> None:
    host, port = parse_endpoint(addr, "stream address", port=True)
    payload = memoryview(bytes(CHUNK))
    with socket.create_connection((host, port or 0), timeout=60) as s:
        s.sendall(struct.pack("!i", my_rank))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the receiver has everything: the next stream does not overlap this one


def _store(master_addr: str, master_port: int, nnodes: int, node_rank: int, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    if node_rank != 0:
        await_endpoint(master_addr, master_port, timeout_s, "--doctor-timeout")
    try:
        return TCPStore(
            master_addr,
            master_port,
            nnodes,
            node_rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as e:
        raise UsageError(
            f"bad --master-addr/--master-port {host_port(master_addr, master_port)}: cannot reach node 0's store "
            f"({e}); "
            "expected the address and a free port of node rank 0"
        ) from None


class StoreSync:
    """This node's side of the exchange through node 0's store.

    Keys are ``numarun-doctor/<name>/<rank>``, one per node (the job's own are node 0's). A node
    other than 0 waits only for single keys; node 0 alone gathers a key of every node, in one
    wait and one read.
    """

    def __init__(self, store: Any, *, rank: int, nnodes: int, timeout_s: float) -> None:
        self.store, self.rank, self.nnodes, self.timeout_s = store, rank, nnodes, timeout_s

    def publish(self, name: str, value: str) -> None:
        """Set this node's ``name`` key."""
        self.store.set(f"{PREFIX}{name}/{self.rank}", value)

    def wait_for(self, name: str, rank: int) -> None:
        """Wait until node ``rank`` has published ``name``."""
        self.gather(name, ranks=[rank], values=False)

    def read(self, name: str, rank: int) -> bytes:
        return self.gather(name, ranks=[rank])[0]

    def gather(self, name: str, *, ranks: Sequence[int] | None = None, values: bool = True) -> list[bytes]:
        """The ``name`` keys of ``ranks`` (default: of every node, which node 0 alone reads): one wait, one read."""
        ranks = range(self.nnodes) if ranks is None else ranks
        keys = [f"{PREFIX}{name}/{r}" for r in ranks]
        self._wait(keys, list(ranks))
        return [bytes(v) for v in self.store.multi_get(keys)] if values and keys else []

    def scatter(self, name: str, values: Sequence[str]) -> None:
        """Node ``r`` gets ``values[r]`` as its ``name`` key (node 0): one request."""
        self.store.multi_set([f"{PREFIX}{name}/{r}" for r in range(len(values))], list(values))

    def _wait(self, keys: list[str], ranks: list[int]) -> None:
        """Wait for ``keys``; a timeout names the nodes whose keys are missing (one line, exit 1)."""
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout_s))
        except (RuntimeError, OSError) as e:
            try:
                missing = [str(r) for k, r in zip(keys, ranks) if not self.store.check([k])]
            except (RuntimeError, OSError):
                missing = []
            who = f"node rank(s) {','.join(missing)}" if missing else "a node"
            raise DoctorError(
                f"{who} did not answer within --doctor-timeout {self.timeout_s:g} s ({type(e).__name__}); "
                "start 'numarun doctor' on every node with the same --nnodes and --master-addr/--master-port"
            ) from None


def exchange(
    report: NodeReport,
    *,
    nnodes: int,
    master_addr: str,
    master_port: int,
    min_link_fraction: float = 0.5,
    seconds: float = 0.5,
    timeout_s: float = 120.0,
    schedule: LinkSchedule = LinkSchedule.AUTO,
) -> dict[str, Any]:
    """Run the multi-node doctor on this node. Node 0 returns the whole verdict; the others
    return it without the per-node detail (``nodes``)."""
    rank = report.node_rank
    store = _store(master_addr, master_port, nnodes, rank, timeout_s)
    host = route_address(master_addr, master_port, zone=True) or ("::" if ":" in master_addr else "0.0.0.0")
    try:
        link = TcpLink(host, rank, seconds)
    except OSError as e:
        raise UsageError(
            f"bad --master-addr/--master-port {host_port(master_addr, master_port)}: this node reaches it from "
            f"{host!r}, where no stream server can listen ({e.strerror or e}); expected node rank 0's address"
        ) from None
    link.start()
    t0 = time.perf_counter()
    try:
        sync = StoreSync(store, rank=rank, nnodes=nnodes, timeout_s=timeout_s)
        return run_exchange(sync, link, report, schedule=schedule, min_link_fraction=min_link_fraction, t0=t0)
    except OSError as e:  # a stream cut or refused mid-way
        raise DoctorError(
            f"node rank {rank}: a bandwidth stream failed ({e}); check the link between the nodes"
        ) from None
    finally:
        link.close()
        del store


def run_exchange(
    sync: StoreSync,
    link: TcpLink,
    report: NodeReport,
    *,
    schedule: LinkSchedule,
    min_link_fraction: float,
    t0: float,
    seed: int | None = None,
) -> dict[str, Any]:
    """The exchange over ``sync`` with measurements by ``link`` (the module docstring's sequence)."""
    rank, nnodes = sync.rank, sync.nnodes
    if rank == 0:
        seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed
        sync.publish("plan", json.dumps({"schedule": resolve(schedule, nnodes).value, "seed": seed}))
    plan = json.loads(sync.read("plan", 0))
    kind, seed = LinkSchedule(plan["schedule"]), int(plan["seed"])
    sync.publish("addr", link.address)
    done = first_rounds(nnodes, kind, seed=seed)
    addrs: dict[int, str] = {}
    _run_slots(
        sync, link, addrs, [(k, b if a == rank else a) for k, rnd in enumerate(done) for a, b in rnd if rank in (a, b)]
    )
    step = len(done)
    while kind is LinkSchedule.BOUNDED:
        # node 0 plans each further round from every node's figures so far (a few numbers each)
        sync.publish(f"fig/{step}", json.dumps(link.received))
        if rank == 0:
            directed = {
                (int(s), r): float(g)
                for r, raw in enumerate(sync.gather(f"fig/{step}"))
                for s, g in json.loads(raw).items()
            }
            nxt = next_round(nnodes, directed, done, min_fraction=min_link_fraction, seed=seed)
            # each node's peer in the round, -1 for none, or "stop" for everyone when nothing is in doubt
            slots = ["stop"] * nnodes if not nxt else ["-1"] * nnodes
            for a, b in nxt:
                slots[a], slots[b] = str(b), str(a)
            sync.scatter(f"slot/{step}", slots)
            done.append(nxt)  # an empty round only with "stop": none follows
        mine = sync.read(f"slot/{step}", rank).decode()
        if mine == "stop":
            break
        if int(mine) >= 0:
            _run_slots(sync, link, addrs, [(step, int(mine))])
        step += 1
    figures = {**report.figures, "recv_gbs": {str(k): v for k, v in sorted(link.received.items())}}
    sync.publish("report", json.dumps(replace(report, figures=figures).to_dict()))
    if rank == 0:
        reports = [NodeReport.from_dict(json.loads(raw)) for raw in sync.gather("report")]
        verdict = judge(
            reports, min_link_fraction=min_link_fraction, schedule={"name": kind.value, "seed": seed, "rounds": step}
        )
        verdict["seconds"] = round(time.perf_counter() - t0, 2)
        sync.publish("verdict", json.dumps(summary(verdict)))
        sync.gather("ack", ranks=range(1, nnodes), values=False)
        return verdict
    verdict = json.loads(sync.read("verdict", 0))
    sync.publish("ack", "1")
    return dict(verdict)


def _run_slots(sync: StoreSync, link: TcpLink, addrs: dict[int, str], slots: list[tuple[int, int]]) -> None:
    """This node's part of some rounds: ``(round, peer)`` in round order. Both ends of a pair
    first say they are ready for the round (done with their earlier pairs, so nothing else
    reaches their stream servers), then the lower rank streams, then the higher."""
    for k, peer in slots:
        sync.publish(f"ready/{k}", "1")
        sync.wait_for(f"ready/{k}", peer)
        if peer not in addrs:
            addrs[peer] = sync.read("addr", peer).decode()
        if sync.rank > peer:  # the lower rank streams first
            sync.wait_for(f"sent/{k}", peer)
        link.stream(addrs[peer], peer)
        sync.publish(f"sent/{k}", "1")
        if sync.rank < peer:
            sync.wait_for(f"sent/{k}", peer)


def summary(verdict: dict[str, Any]) -> dict[str, Any]:
    """The verdict as the nodes other than 0 receive it: without the per-node detail."""
    return {k: v for k, v in verdict.items() if k != "nodes"}


def judge(
    reports: list[NodeReport], *, min_link_fraction: float, schedule: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Pure: the node reports -> the verdict (findings of every node, comparison, slow nodes and links)."""
    directed = {
        (int(sender), r.node_rank): float(gbs)
        for r in reports
        for sender, gbs in (r.figures.get("recv_gbs") or {}).items()
    }
    lv = link_verdict(directed, len(reports), min_link_fraction)
    findings = [
        *compare_nodes(reports),
        *(
            Finding(
                Severity.ERROR,
                "slow-node",
                f"node {s}",
                f"node rank {s} ({reports[s].hostname}) reaches at best {lv.node_gbs[s]:.3f} GB/s to any of its "
                f"{lv.peers[s]} peer(s) measured, below {min_link_fraction:g} of the median {lv.median_gbs:.3f} GB/s: "
                "check its NIC, cable and switch port, or leave it out",
            )
            for s in lv.slow_nodes
        ),
        *(
            Finding(
                Severity.ERROR,
                "slow-link",
                f"nodes {a}-{b}",
                f"the link between node rank {a} ({reports[a].hostname}) and {b} ({reports[b].hostname}) reaches "
                f"{gbs:.3f} GB/s, below {min_link_fraction:g} of the median {lv.median_gbs:.3f} GB/s, while both reach "
                "other peers at full speed: check the switch ports, cables and routes between them; leaving out "
                "either node avoids it",
            )
            for a, b, gbs in lv.slow_links
        ),
    ]
    nodes = [
        {
            **r.to_dict(),
            "figures": {
                **r.figures,
                "link_gbs": lv.node_gbs.get(r.node_rank, 0.0),
                "link_peers": lv.peers.get(r.node_rank, 0),
            },
        }
        for r in reports
    ]
    bad = sorted({r.node_rank for r in reports if has_error(r.findings)} | set(lv.slow_nodes) | odd_nodes(reports))
    everything = findings + [f for r in reports for f in r.findings]
    return {
        "findings": [f.to_dict() for f in sort_findings(findings)],
        "nodes": nodes,
        "slow_nodes": list(lv.slow_nodes),
        "slow_links": [[a, b, gbs] for a, b, gbs in lv.slow_links],
        "bad_nodes": bad,
        "exclude": ",".join(reports[i].hostname for i in bad),
        "ok": not has_error(everything),
        "counts": {s.value: sum(1 for f in everything if f.severity is s) for s in Severity},
        "links": {"schedule": schedule or {}, "pairs_measured": len(lv.pairs), "median_gbs": round(lv.median_gbs, 4)},
    }
