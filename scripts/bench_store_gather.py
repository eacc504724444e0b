#!/usr/bin/env python3
"""The doctor's exchange through node 0's TCPStore with many simulated nodes on this machine.

Each simulated node is a thread with its own TCPStore client (one server, as in a real run);
the link streams are left out (a stream records a fixed figure at its receiver at once), so
what is timed is the store traffic alone. Two protocols, side by side:

- ``now``: the product's own :func:`numarun.doctor.multinode.run_exchange` (bounded schedule,
  one slow node so that every round after the first ones is planned: the most traffic);
- ``previous``: the previous release's sequence, store calls as it made them: every node waited
  for and read every node's address, every round ended with a barrier where every node waited
  for every node's key, node 0 read the reports one by one and every node read the whole
  verdict, per-node detail included. Its rounds were all pairs (n-1); it runs here with as many
  rounds as ``now`` takes (``--previous-rounds``), and its cost at n-1 rounds is extrapolated from
  the slope between no round and four times as many.

A node's report has the shape of a real one (findings, facts, memory and host<->device
figures for 8 GPUs). Requests and keys are counted at each client.

Usage: .venv/bin/python scripts/bench_store_gather.py [--clients 256] [--protocol both] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore

from numarun.doctor.model import Finding, NodeReport, Severity
from numarun.doctor.multinode import PREFIX, StoreSync, run_exchange
from numarun.doctor.schedule import LinkSchedule

TIMEOUT = timedelta(seconds=600)
SLOW_NODE = 1


class CountingStore:
    """A TCPStore client that counts its requests and the keys they name."""

    def __init__(self, store: Any) -> None:
        self.store, self.requests, self.keys = store, 0, 0

    def _count(self, keys: int) -> None:
        self.requests += 1
        self.keys += keys

    def set(self, key: str, value: str) -> None:
        self._count(1)
        self.store.set(key, value)

    def get(self, key: str) -> bytes:
        self._count(1)
        return bytes(self.store.get(key))

    def wait(self, keys: list[str], timeout: timedelta = TIMEOUT) -> None:
        self._count(len(keys))
        self.store.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self._count(len(keys))
        return bool(self.store.check(keys))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count(len(keys))
        return list(self.store.multi_get(keys))

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self._count(len(keys))
        self.store.multi_set(keys, values)


def node_report(rank: int) -> NodeReport:
    """A report the size of a real 8-GPU node's."""
    findings = (
        Finding(Severity.INFO, "smt", "cpu", "SMT is on"),
        Finding(
            Severity.WARN,
            "pcie-link",
            "0000:18:00.0",
            "GPU 0 PCIe link runs at 16 GT/s x16 below 32 GT/s x16: "
            "GPUs lower the link speed when idle: check again under load",
        ),
    )
    facts = {
        "gpu_count": 8,
        "gpu_models": ["NVIDIA H200"],
        "compute_nics": [f"mlx5_{i}" for i in range(8)],
        "driver": "570.124.06",
        "cuda": "12.8",
        "nccl": "2.26.2",
        "torch": "2.13.0",
        "python": "3.11.9",
    }
    buses = [f"0000:{0x18 + 0x20 * i:02x}:00.0" for i in range(8)]
    figures = {
        "mem_bw_gbs": {"0": 101.3, "1": 99.8},
        "h2d_gbs": {b: 55.1 for b in buses},
        "d2h_gbs": {b: 54.2 for b in buses},
    }
    return NodeReport(rank, f"gpu-{rank:05d}", findings, facts, figures)


class NullLink:
    """Streams nothing: the receiver records a figure at once (the slow node's is low)."""

    def __init__(self, rank: int, links: dict[int, NullLink]) -> None:
        self.rank, self.links, self._received = rank, links, {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{10000 + self.rank}"

    @property
    def received(self) -> dict[int, float]:
        return self._received

    def stream(self, peer_address: str, peer: int) -> None:
        self.links[peer]._received[self.rank] = 0.1 if SLOW_NODE in (self.rank, peer) else 1.0


def previous_exchange(store: CountingStore, rank: int, n: int, rounds: int, report: str) -> None:
    """The previous release's store calls (its multinode.py, streams left out)."""

    def barrier(name: str) -> None:
        store.set(f"{PREFIX}{name}/{rank}", "1")
        store.wait([f"{PREFIX}{name}/{i}" for i in range(n)])

    store.set(f"{PREFIX}addr/{rank}", f"127.0.0.1:{10000 + rank}")
    store.wait([f"{PREFIX}addr/{i}" for i in range(n)])
    for i in range(n):
        store.get(f"{PREFIX}addr/{i}")
    for r in range(rounds):
        # the pair's own key (each round: one node sets it, its peer waits for it), then the barrier
        peer = rank ^ 1
        if peer < n:
            if rank < peer:
                store.set(f"{PREFIX}sent/{r}/{rank}", "1")
            else:
                store.wait([f"{PREFIX}sent/{r}/{peer}"])
        barrier(f"round{r}")
    store.set(f"{PREFIX}report/{rank}", report)
    if rank == 0:
        store.wait([f"{PREFIX}report/{i}" for i in range(n)])
        reports = [json.loads(store.get(f"{PREFIX}report/{i}")) for i in range(n)]
        store.set(f"{PREFIX}verdict", json.dumps({"nodes": reports, "findings": [], "ok": True}))
        store.wait([f"{PREFIX}ack/{i}" for i in range(1, n)])
        return
    store.wait([f"{PREFIX}verdict"])
    store.get(f"{PREFIX}verdict")
    store.set(f"{PREFIX}ack/{rank}", "1")


def run(protocol: str, clients: int, *, previous_rounds: int) -> dict[str, Any]:
    server = TCPStore("127.0.0.1", 0, None, True, timeout=TIMEOUT, wait_for_workers=False)
    port = server.port
    # clients connect before the clock starts, all at once: a client formats its address with
    # getnameinfo, which waits for reverse DNS (seconds where that does not answer)
    raws: list[Any] = [server] + [None] * (clients - 1)

    def connect(rank: int) -> None:
        raws[rank] = TCPStore("127.0.0.1", port, None, False, timeout=TIMEOUT)

    connecting = [threading.Thread(target=connect, args=(r,)) for r in range(1, clients)]
    for t in connecting:
        t.start()
    for t in connecting:
        t.join()
    stores = [CountingStore(raw) for raw in raws]
    links: dict[int, NullLink] = {}
    for rank in range(clients):
        links[rank] = NullLink(rank, links)
    errors: list[BaseException] = []
    results: list[Any] = [None] * clients
    start = threading.Barrier(clients + 1)

    def node(rank: int) -> None:
        try:
            start.wait()
            report = node_report(rank)
            if protocol == "now":
                sync = StoreSync(stores[rank], rank=rank, nnodes=clients, timeout_s=TIMEOUT.total_seconds())
                results[rank] = run_exchange(
                    sync,
                    links[rank],
                    report,
                    schedule=LinkSchedule.BOUNDED,
                    min_link_fraction=0.5,
                    t0=time.perf_counter(),
                    seed=1,
                )
            else:
                previous_exchange(stores[rank], rank, clients, previous_rounds, json.dumps(report.to_dict()))
        except BaseException as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=node, args=(r,), daemon=True) for r in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    out = {
        "protocol": protocol,
        "clients": clients,
        "seconds": wall,
        "requests_node0": stores[0].requests,
        "requests_max_other": max(s.requests for s in stores[1:]),
        "requests_total": sum(s.requests for s in stores),
        "keys_total": sum(s.keys for s in stores),
        "keys_max_other": max(s.keys for s in stores[1:]),
    }
    if protocol == "now":
        verdict = results[0]
        assert verdict["slow_nodes"] == [SLOW_NODE], verdict["slow_nodes"]
        out["rounds"] = verdict["links"]["schedule"]["rounds"]
        out["verdict_bytes_other"] = len(json.dumps(results[1]))
    else:
        out["rounds"] = previous_rounds
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[256])
    ap.add_argument("--protocol", choices=["now", "previous", "both"], default="both")
    ap.add_argument("--previous-rounds", type=int, default=6, help="rounds of the previous protocol's side-by-side run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    protocols = ["previous", "now"] if args.protocol == "both" else [args.protocol]
    rows = []
    for clients in args.clients:
        for protocol in protocols:
            runs = [run(protocol, clients, previous_rounds=args.previous_rounds) for _ in range(args.repeat)]
            row = dict(runs[0])
            row["seconds"] = statistics.median(r["seconds"] for r in runs)
            row["seconds_min"] = min(r["seconds"] for r in runs)
            if protocol == "previous":
                # the cost of one more round: the slope between no round and four times as many
                base = statistics.median(
                    run(protocol, clients, previous_rounds=0)["seconds"] for _ in range(args.repeat)
                )
                more = 4 * args.previous_rounds
                top = statistics.median(
                    run(protocol, clients, previous_rounds=more)["seconds"] for _ in range(args.repeat)
                )
                row["per_round_seconds"] = (top - base) / more
                row["all_pairs_seconds"] = base + row["per_round_seconds"] * (clients - 1)
            rows.append(row)
            if not args.json:
                extra = (
                    f"  per round {row['per_round_seconds'] * 1e3:.1f} ms, with its {clients - 1} rounds "
                    f"{row['all_pairs_seconds']:.1f} s"
                    if protocol == "previous"
                    else f"  verdict to a node other than 0: {row['verdict_bytes_other']} bytes"
                )
                print(
                    f"{protocol:>8} {clients:5d} nodes, {row['rounds']} rounds: {row['seconds']:.3f} s median "
                    f"(min {row['seconds_min']:.3f}, {args.repeat} runs); requests: node 0 {row['requests_node0']}, "
                    f"other node at most {row['requests_max_other']}, all {row['requests_total']}; keys named: all "
                    f"{row['keys_total']}, other node at most {row['keys_max_other']}{extra}",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
