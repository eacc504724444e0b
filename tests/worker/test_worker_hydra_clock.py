"""The clock a user's Hydra app sees under numarun: agreed by every rank of the job."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import free_port

from numarun.worker import hydra_pin


def test_one_node_keeps_its_own_clock() -> None:
    assert (
        hydra_pin.agreed_now("2020-01-02T03:04:05", {"GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "x", "MASTER_PORT": "1"})
        == "2020-01-02T03:04:05"
    )
    assert hydra_pin.agreed_now("2020-01-02T03:04:05", {}) == "2020-01-02T03:04:05"


def test_the_first_rank_sets_the_clock_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    env = {
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "job",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
    assert hydra_pin.agreed_now("2020-01-02T03:04:05", env) == "2020-01-02T03:04:05"
    assert hydra_pin.agreed_now("2020-01-02T03:04:07", env) == "2020-01-02T03:04:05"  # the later node
    restarted = {**env, "TORCHELASTIC_RESTART_COUNT": "1"}  # restarted workers keep the job's run dir
    assert hydra_pin.agreed_now("2020-01-02T03:09:00", restarted) == "2020-01-02T03:04:05"
    del master


def test_no_store_keeps_the_nodes_clock_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hydra_pin, "AGREE_TIMEOUT_S", 1.0)
    env = {"GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # nobody listens
    with caplog.at_level("WARNING", logger="numarun.worker.bootstrap.hydra_pin"):
        assert hydra_pin.agreed_now("2020-01-02T03:04:05", env) == "2020-01-02T03:04:05"
    assert "could not agree on Hydra's clock" in caplog.text
