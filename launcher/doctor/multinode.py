"""The doctor across nodes: every node reports to node rank 0 through a c10d ``TCPStore``
(no process group is initialised, so no backend or GPU is needed), and the nodes measure
their links pairwise over plain TCP streams.

Sequence (keys under ``numarun-doctor/``):

1. each node starts a stream server on the address it reaches node 0 from and publishes it;
2. rounds of :func:`~.compare.pairwise_schedule`: in each pair the lower rank streams to the
   higher for ``seconds``, then the other way; the receiver times from the first byte to the
   end of the stream and keeps the figure; every round ends at a barrier;
3. each node publishes its report (findings, facts, received figures);
4. node 0 compares, judges and publishes the verdict; the others read it and acknowledge,
   and node 0 closes the store only after every acknowledgement.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import struct
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from ..errors import UsageError
from .compare import (
    compare_nodes,
    node_link_figures,
    odd_nodes,
    pairwise_schedule,
    slow_nodes,
)
from .model import DoctorError, Finding, NodeReport, Severity, has_error, sort_findings

log = logging.getLogger(__name__)

PREFIX = "numarun-doctor/"
CHUNK = 256 << 10


class _StreamServer(threading.Thread):
    """Accepts one stream at a time; records GB/s per sending node rank."""

    def __init__(self, host: str) -> None:
        super().__init__(daemon=True, name="numarun-doctor-streams")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.received: dict[int, float] = {}

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    head = _recv_exact(conn, 4)
                    sender = struct.unpack("!i", head)[0]
                    buf = bytearray(CHUNK)
                    total = 0
                    t0 = None
                    while True:
                        n = conn.recv_into(buf)
                        if not n:
                            break
                        if t0 is None:
                            t0 = time.perf_counter()
                        total += n
                    dt = time.perf_counter() - (t0 or time.perf_counter())
                    self.received[sender] = round(total / dt / 1e9, 4) if dt > 0 else 0.0
                    conn.sendall(b"k")
                except OSError as e:
                    log.warning("doctor stream failed: %s", e)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise OSError("stream closed early")
        data += part
    return data


def _stream_to(addr: str, my_rank: int, seconds: float) -> None:
    host, port = addr.rsplit(":", 1)
    payload = memoryview(bytes(CHUNK))
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(struct.pack("!i", my_rank))
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the receiver has everything: the next stream does not overlap this one


def local_address(master_addr: str, master_port: int) -> str:
    """The address of the interface this node reaches node 0 through (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(master_addr), master_port))
            return str(s.getsockname()[0])
        except OSError:
            return "0.0.0.0"


def _store(master_addr: str, master_port: int, nnodes: int, node_rank: int, timeout_s: float) -> Any:
    from torch.distributed import TCPStore

    try:
        return TCPStore(master_addr, master_port, nnodes, node_rank == 0, timeout=timedelta(seconds=timeout_s),
                        wait_for_workers=False)
    except (RuntimeError, OSError) as e:
        raise UsageError(
            f"bad --master-addr/--master-port {master_addr}:{master_port}: cannot reach node 0's store ({e}); "
            "expected the address and a free port of node rank 0"
        ) from None


def _wait(store: Any, keys: list[str], timeout_s: float) -> None:
    """Wait for ``keys``; a timeout names the nodes whose keys are missing (one line, exit 1)."""
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except (RuntimeError, OSError) as e:
        try:
            missing = [k.rsplit("/", 1)[-1] for k in keys if not store.check([k])]
        except (RuntimeError, OSError):
            missing = []
        who = f"node rank(s) {','.join(missing)}" if missing else "a node"
        raise DoctorError(
            f"{who} did not answer within --doctor-timeout {timeout_s:g} s ({type(e).__name__}); "
            "start 'numarun doctor' on every node with the same --nnodes and --master-addr/--master-port"
        ) from None


def _barrier(store: Any, name: str, rank: int, nnodes: int, timeout_s: float) -> None:
    store.set(f"{PREFIX}{name}/{rank}", "1")
    _wait(store, [f"{PREFIX}{name}/{i}" for i in range(nnodes)], timeout_s)


def exchange(
    report: NodeReport, *, nnodes: int, master_addr: str, master_port: int, min_link_fraction: float = 0.5,
    seconds: float = 0.5, timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Run the multi-node doctor on this node; every node returns the whole verdict."""
    rank = report.node_rank
    store = _store(master_addr, master_port, nnodes, rank, timeout_s)
    server = _StreamServer(local_address(master_addr, master_port))
    server.start()
    t0 = time.perf_counter()
    try:
        return _exchange(store, server, report, nnodes=nnodes, min_link_fraction=min_link_fraction,
                         seconds=seconds, timeout_s=timeout_s, t0=t0)
    except OSError as e:  # a stream cut or refused mid-way
        raise DoctorError(f"node rank {rank}: a bandwidth stream failed ({e}); check the link between the nodes") from None
    finally:
        server.close()
        del store


def _exchange(store: Any, server: _StreamServer, report: NodeReport, *, nnodes: int, min_link_fraction: float,
              seconds: float, timeout_s: float, t0: float) -> dict[str, Any]:
    rank = report.node_rank
    store.set(f"{PREFIX}addr/{rank}", f"{server.sock.getsockname()[0]}:{server.port}")
    _wait(store, [f"{PREFIX}addr/{i}" for i in range(nnodes)], timeout_s)
    addrs = {i: store.get(f"{PREFIX}addr/{i}").decode() for i in range(nnodes)}
    for r, pairs in enumerate(pairwise_schedule(nnodes)):
        for a, b in pairs:
            if rank == a:
                _stream_to(addrs[b], rank, seconds)
                store.set(f"{PREFIX}sent/{r}/{a}", "1")
            elif rank == b:
                _wait(store, [f"{PREFIX}sent/{r}/{a}"], timeout_s)
                _stream_to(addrs[a], rank, seconds)
        _barrier(store, f"round{r}", rank, nnodes, timeout_s)
    figures = {**report.figures, "recv_gbs": {str(k): v for k, v in sorted(server.received.items())}}
    mine = replace(report, figures=figures)
    store.set(f"{PREFIX}report/{rank}", json.dumps(mine.to_dict()))
    if rank == 0:
        _wait(store, [f"{PREFIX}report/{i}" for i in range(nnodes)], timeout_s)
        reports = [NodeReport.from_dict(json.loads(store.get(f"{PREFIX}report/{i}"))) for i in range(nnodes)]
        verdict = judge(reports, min_link_fraction=min_link_fraction)
        verdict["seconds"] = round(time.perf_counter() - t0, 2)
        store.set(f"{PREFIX}verdict", json.dumps(verdict))
        _wait(store, [f"{PREFIX}ack/{i}" for i in range(1, nnodes)], timeout_s)
        return verdict
    _wait(store, [f"{PREFIX}verdict"], timeout_s)
    verdict = json.loads(store.get(f"{PREFIX}verdict"))
    store.set(f"{PREFIX}ack/{rank}", "1")
    return verdict


def judge(reports: list[NodeReport], *, min_link_fraction: float) -> dict[str, Any]:
    """Pure: the node reports -> the verdict (findings of every node, comparison, slow nodes)."""
    n = len(reports)
    directed: dict[tuple[int, int], float] = {}
    for r in reports:
        for sender, gbs in (r.figures.get("recv_gbs") or {}).items():
            directed[(int(sender), r.node_rank)] = float(gbs)
    link = node_link_figures(directed, n)
    slow = slow_nodes(link, min_link_fraction)
    findings: list[Finding] = list(compare_nodes(reports))
    median = statistics.median(link.values()) if link else 0.0
    for s in slow:
        findings.append(Finding(
            Severity.ERROR, "slow-node", f"node {s}",
            f"node rank {s} ({reports[s].hostname}) reaches at best {link[s]:.3f} GB/s to any peer, below "
            f"{min_link_fraction:g} of the median {median:.3f} GB/s: check its NIC, cable and switch port, or leave it out",
        ))
    nodes = []
    for r in reports:
        d = r.to_dict()
        d["figures"]["link_gbs"] = link.get(r.node_rank, 0.0)
        nodes.append(d)
    all_findings = [f for r in reports for f in r.findings]
    bad = sorted({r.node_rank for r in reports if has_error(r.findings)} | set(slow) | odd_nodes(reports))
    return {
        "findings": [f.to_dict() for f in sort_findings(findings)],
        "nodes": nodes,
        "slow_nodes": slow,
        "bad_nodes": bad,
        "exclude": ",".join(reports[i].hostname for i in bad),
        "ok": not has_error(findings) and not has_error(all_findings),
    }
