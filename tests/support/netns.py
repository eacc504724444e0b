"""Test "nodes" as network namespaces on one bridge, with chosen links throttled (root only; skips otherwise)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import pytest

RATE = "100mbit"
"""The throttled links' rate (tc tbf / htb)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _tc(ns: str, *args: str) -> None:
    subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "tc", *args], check=True, capture_output=True)


def _cleanup(names: list[str]) -> None:
    for ns in names:
        _ip("netns", "del", ns, check=False)


@contextlib.contextmanager
def namespace_nodes(
    names: list[str], bridge: str, subnet: str, *, slow_node: int | None, slow_links: tuple[tuple[int, int], ...] = ()
):
    """Namespaces ``names`` on one bridge (in namespace ``bridge``) at ``subnet``.1.., with
    ``slow_node``'s link throttled both ways and each of ``slow_links`` throttled both ways
    (an htb class on each end's egress takes only the traffic to the other end)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    if not shutil.which("ip") or not shutil.which("tc") or not shutil.which("nsenter"):
        pytest.skip("needs ip, tc and nsenter")
    _cleanup(names + [bridge])
    try:
        try:
            _ip("netns", "add", bridge)
        except subprocess.CalledProcessError as e:
            pytest.skip(f"cannot create a network namespace: {e.stderr.strip()}")
        br = ["-n", bridge]
        _ip(*br, "link", "add", "br0", "type", "bridge")
        _ip(*br, "link", "set", "br0", "up")
        _ip(*br, "link", "set", "lo", "up")
        for i, ns in enumerate(names):
            _ip("netns", "add", ns)
            _ip("link", "add", f"dv{i}", "netns", ns, "type", "veth", "peer", "name", f"dp{i}", "netns", bridge)
            _ip("-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", f"dv{i}")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", f"dv{i}", "up")
            _ip(*br, "link", "set", f"dp{i}", "master", "br0")
            _ip(*br, "link", "set", f"dp{i}", "up")
        tbf = ["tbf", "rate", RATE, "burst", "64kb", "latency", "50ms"]
        if slow_node is not None:
            # both directions of the slow node's link: its own egress and the bridge's egress to it
            _tc(names[slow_node], "qdisc", "add", "dev", f"dv{slow_node}", "root", *tbf)
            _tc(bridge, "qdisc", "add", "dev", f"dp{slow_node}", "root", *tbf)
        for a, b in slow_links:
            for src, dst in ((a, b), (b, a)):
                dev = f"dv{src}"
                # htb without a default class sends unclassified traffic straight out, unshaped
                _tc(names[src], "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb")
                _tc(names[src], "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", RATE)
                _tc(
                    names[src],
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "1",
                    "u32",
                    "match",
                    "ip",
                    "dst",
                    f"{subnet}.{dst + 1}/32",
                    "flowid",
                    "1:20",
                )
        yield [f"{subnet}.{i + 1}" for i in range(len(names))]
    finally:
        _cleanup(names + [bridge])
