"""A NIC's link and counters from sysfs, on a constructed node (tests/fixtures/nics/constructed-node, made by its
script) and the recorded H200 VM's virtio interface."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FIXTURES

from numarun.topology.nic_health import IB_COUNTERS, NET_COUNTERS, read_interface, read_nic, read_rdma_port

NODE = FIXTURES / "nics" / "constructed-node"
ABOUT = json.loads((NODE / "about.json").read_text())


def test_an_infiniband_port() -> None:
    port = read_rdma_port(NODE / "t0", "mlx5_0", 1)
    assert port is not None and (port.name, port.port, port.rdma, port.up, port.rate_gbps) == (
        "mlx5_0",
        1,
        True,
        True,
        200.0,
    )
    assert set(port.counters) == set(IB_COUNTERS) and port.counters["symbol_error"] == 3
    words = port.counters["port_xmit_data"], port.counters["port_rcv_data"]
    assert port.sent_received() == (words[0] * 4, words[1] * 4)  # the IBA counts 4-octet words
    assert read_rdma_port(NODE / "t0", "mlx5_0") == port  # port 0: the first
    slow, down = read_nic(NODE / "t0", "mlx5_3"), read_nic(NODE / "t0", "mlx5_6")
    assert slow is not None and slow.rate_gbps == 100.0
    assert down is not None and down.up is False
    assert read_rdma_port(NODE / "t0", "mlx5_0", 2) is None and read_rdma_port(NODE / "t0", "mlx5_9") is None


def test_counters_move_between_the_readings() -> None:
    seconds = ABOUT["seconds"]

    def moved(nic: str, key: str) -> int:
        a, b = (read_nic(NODE / t, nic) for t in ("t0", "t1"))
        assert a is not None and b is not None
        return b.counters[key] - a.counters[key]

    assert moved("mlx5_0", "port_xmit_data") * 4 / seconds == 10e9
    assert moved("mlx5_0", "symbol_error") == 0 and moved("mlx5_5", "symbol_error") == 1250
    assert moved("mlx5_4", "port_xmit_wait") == 48_150_000 and moved("mlx5_1", "port_xmit_wait") == 150_000
    assert moved("eth3", "rx_dropped") == 48_000 and moved("eth0", "rx_dropped") == 0


def test_an_ethernet_interface() -> None:
    eth = read_nic(NODE / "t0", "eth0")
    assert eth is not None and (eth.port, eth.rdma, eth.up, eth.rate_gbps) == (0, False, True, 100.0)
    assert set(eth.counters) == set(NET_COUNTERS) and eth.sent_received() == (
        eth.counters["tx_bytes"],
        eth.counters["rx_bytes"],
    )
    assert read_interface(NODE / "t0", "eth9") is None


def test_a_virtio_interface_has_no_speed(h200_tree: Path) -> None:
    """The recorded H200 VM: its eth0 says speed -1 (virtio has none) and its capture kept no statistics."""
    eth = read_interface(h200_tree, "eth0")
    assert eth is not None and (eth.rate_gbps, eth.up, eth.counters) == (0.0, None, {})
    assert eth.sent_received() is None
