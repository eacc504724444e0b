"""The doctor at scale without processes: the link schedules, the verdict on slow nodes and
slow links, a reduced grid of scripts/doctor_scale.py, and the store exchange with many
nodes as threads of this process (one TCPStore, as in a real run)."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from typing import Any

import pytest
from helpers import REPO

from numarun.cli import main as cli_main
from numarun.doctor.compare import link_verdict, node_link_figures, slow_nodes
from numarun.doctor.model import Finding, NodeReport, Severity
from numarun.doctor.multinode import StoreSync, judge, run_exchange, summary
from numarun.doctor.schedule import (
    MAX_ROUNDS,
    LinkSchedule,
    all_pairs_rounds,
    doubts,
    first_rounds,
    matching_rounds,
    next_round,
    pairwise_schedule,
    resolve,
)


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scale() -> Any:
    return _script("doctor_scale")


def _disjoint(rnd) -> bool:
    ends = [x for p in rnd for x in p]
    return len(ends) == len(set(ends))


# --- schedules ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_pairwise_schedule_covers_every_pair_once_without_overlap(n):
    rounds = pairwise_schedule(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    assert all(_disjoint(r) for r in rounds)
    assert len(rounds) == all_pairs_rounds(n)


@pytest.mark.parametrize("n", [7, 8, 9, 64, 1001, 4096])
def test_matching_rounds_meet_distinct_peers_from_a_seed(n):
    rounds = matching_rounds(n, rounds=3, seed=11)
    assert rounds == matching_rounds(n, rounds=3, seed=11)  # every node computes the same
    assert rounds != matching_rounds(n, rounds=3, seed=12)
    pairs = [p for r in rounds for p in r]
    assert len(pairs) == len(set(pairs))  # no pair twice
    assert all(_disjoint(r) for r in rounds)
    peers: dict[int, int] = {}
    for a, b in pairs:
        peers[a] = peers.get(a, 0) + 1
        peers[b] = peers.get(b, 0) + 1
    # odd n: one node sits out each round
    assert len(peers) == n and min(peers.values()) >= (3 if n % 2 == 0 else 2)


def test_auto_takes_all_pairs_while_it_fits_the_bound():
    assert [resolve(LinkSchedule.AUTO, n).value for n in (2, 3, 6, 7, 8, 1024)] == ["all-pairs"] * 3 + ["bounded"] * 3
    assert resolve(LinkSchedule.ALL_PAIRS, 1024) is LinkSchedule.ALL_PAIRS
    assert len(first_rounds(40, LinkSchedule.ALL_PAIRS, seed=0)) == 39
    assert len(first_rounds(40, LinkSchedule.BOUNDED, seed=0)) == 3


def _directed(pairs: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    out = {}
    for (a, b), g in pairs.items():
        out[(a, b)] = out[(b, a)] = g
    return out


def test_next_round_sends_a_suspect_to_known_good_nodes_it_has_not_met():
    n = 40
    slow = 5
    done = matching_rounds(n, rounds=3, seed=3)
    figs = {p: (0.2 if slow in p else 1.0) for r in done for p in r}
    d = doubts(n, _directed(figs), done, min_fraction=0.5)
    assert d.suspects == (slow,) and d.suspect_links == ()
    nxt = next_round(n, _directed(figs), done, min_fraction=0.5, seed=3)
    assert _disjoint(nxt)
    (partner,) = [b if a == slow else a for a, b in nxt if slow in (a, b)]
    met = {x for r in done for p in r if slow in p for x in p}
    assert partner not in met and partner in d.known_good
    # the others meet a new peer at no cost in time
    assert len(nxt) == n // 2 and not {p for p in nxt} & {p for r in done for p in r}


def test_next_round_measures_a_suspect_link_again_and_stops_when_nothing_is_in_doubt():
    n = 40
    done = matching_rounds(n, rounds=3, seed=4)
    link = done[1][0]
    figs = {p: (0.2 if p == link else 1.0) for r in done for p in r}
    d = doubts(n, _directed(figs), done, min_fraction=0.5)
    assert d.suspects == () and d.suspect_links == (link,)
    nxt = next_round(n, _directed(figs), done, min_fraction=0.5, seed=4)
    assert link in nxt
    # measured twice: no longer in doubt
    again = [*done, nxt]
    figs.update({p: 1.0 for p in nxt if p != link})
    assert next_round(n, _directed(figs), again, min_fraction=0.5, seed=4) == []
    healthy = {p: 1.0 for r in done for p in r}
    assert next_round(n, _directed(healthy), done, min_fraction=0.5, seed=4) == []
    # the bound holds whatever is in doubt
    assert next_round(n, _directed(figs), [*done, nxt, nxt, nxt], min_fraction=0.5, seed=4) == []
    assert len([*done, nxt, nxt, nxt]) == MAX_ROUNDS


# --- the verdict -------------------------------------------------------------------------


def test_slow_node_stands_out_from_its_peers():
    fast, slow = 1.0, 0.05
    directed = {(a, b): slow if 3 in (a, b) else fast for a in range(4) for b in range(4) if a != b}
    figures = node_link_figures(directed, 4)
    assert slow_nodes(figures, 0.5) == [3]
    # two nodes cannot tell a slow node from a slow link
    assert slow_nodes(node_link_figures({(0, 1): 1.0, (1, 0): 0.01}, 2), 0.5) == []


def test_a_slow_link_is_named_as_a_link_not_as_its_nodes():
    pairs = {(a, b): 1.0 for a in range(5) for b in range(a + 1, 5)}
    pairs[(1, 3)] = 0.1
    lv = link_verdict(_directed(pairs), 5, 0.5)
    assert lv.slow_nodes == () and lv.slow_links == ((1, 3, 0.1),)
    # a slow pair explained by a slow node is not a slow link
    pairs = {p: (0.1 if 4 in p else 1.0) for p in pairs}
    lv = link_verdict(_directed(pairs), 5, 0.5)
    assert lv.slow_nodes == (4,) and lv.slow_links == ()
    # a pair measured one way only (a cut stream) is not judged
    assert link_verdict({(0, 1): 0.1, (1, 2): 1.0, (2, 1): 1.0}, 3, 0.5).pairs == {(1, 2): 1.0}


def _report(rank: int, recv: dict[int, float] | None = None, **facts) -> NodeReport:
    base = {"gpu_count": 8, "gpu_models": ["NVIDIA H100"], "compute_nics": ["mlx5_0"], "torch": "2.9.0"}
    return NodeReport(
        rank, f"host{rank}", (), {**base, **facts}, {"recv_gbs": {str(k): v for k, v in (recv or {}).items()}}
    )


def test_judge_names_the_node_that_differs():
    reports = [_report(0), _report(1, gpu_count=7), _report(2, torch="2.8.0")]
    verdict = judge(reports, min_link_fraction=0.5)
    mism = [f for f in verdict["findings"] if f["check"] == "node-mismatch"]
    assert {(f["device"], f["severity"]) for f in mism} == {("nodes 1", "error"), ("nodes 2", "warn")}
    assert verdict["bad_nodes"] == [1] and verdict["exclude"] == "host1" and verdict["ok"] is False


def test_judge_collects_each_nodes_errors():
    bad = NodeReport(1, "host1", (Finding(Severity.ERROR, "rdma-port", "mlx5_0:1", "down"),), _report(1).facts, {})
    verdict = judge([_report(0), bad, _report(2)], min_link_fraction=0.5)
    assert verdict["bad_nodes"] == [1] and verdict["ok"] is False and verdict["findings"] == []
    assert verdict["counts"]["error"] == 1


def test_judge_names_a_slow_link_with_both_hosts_and_excludes_neither():
    n = 4
    recv: dict[int, dict[int, float]] = {r: {} for r in range(n)}
    for a in range(n):
        for b in range(n):
            if a != b:
                recv[b][a] = 0.1 if {a, b} == {0, 2} else 1.0
    verdict = judge(
        [_report(r, recv[r]) for r in range(n)],
        min_link_fraction=0.5,
        schedule={"name": "all-pairs", "seed": 0, "rounds": 3},
    )
    (f,) = verdict["findings"]
    assert (f["check"], f["device"], f["severity"]) == ("slow-link", "nodes 0-2", "error")
    assert "host0" in f["message"] and "host2" in f["message"]
    assert verdict["slow_links"] == [[0, 2, 0.1]] and verdict["slow_nodes"] == []
    assert verdict["bad_nodes"] == [] and verdict["ok"] is False
    assert verdict["links"]["pairs_measured"] == 6
    # what the other nodes receive grows with the faults, not with the node count
    small = summary(verdict)
    assert "nodes" not in small and small["slow_links"] == verdict["slow_links"]


# --- the simulation ------------------------------------------------------------------------


def test_reduced_grid_misses_nothing_and_flags_nothing_healthy(scale):
    rows = scale.grid(nodes=(2, 3, 5, 8, 9, 64), seeds=8)
    for row in rows:
        assert row["failures"] == [], row
        assert row["max_rounds"] <= MAX_ROUNDS
        assert row["draws"] > 0
        # every node against several distinct peers (three nodes have two peers in all)
        assert row["min_peers"] >= min(3, row["nodes"] - 1)
    by_n = {r["nodes"]: r for r in rows}
    # the small counts the grid has to set aside, and why: no healthy majority, or no healthy
    # peer over a good link for some node (then even all pairs cannot tell)
    assert by_n[2]["draws"] == 8 and by_n[2]["undecidable"] > 0
    assert by_n[64]["undecidable"] == 0
    # slow links measured were named as links
    assert by_n[8]["slow_links_measured"] > 0 and by_n[8]["slow_links_flagged"] == by_n[8]["slow_links_measured"]


@pytest.mark.parametrize("n", [1001, 1024, 4096])
def test_large_jobs_stay_within_the_bound(scale, n):
    r = scale.simulate(nodes=n, slow_nodes=3, slow_links=2, seed=5)
    assert r["rounds"] <= MAX_ROUNDS and r["est_seconds"] < 60
    assert (r["missed"], r["false_positives"], r["false_links"]) == (0, 0, 0)
    assert r["slow_links_flagged"] == r["slow_links_measured"]
    assert r["min_peers"] >= 3  # every node against several distinct peers


def test_simulation_prints_the_documented_keys(scale, capsys):
    assert scale.main(["--nodes", "64", "--slow-nodes", "1", "--slow-links", "1", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {
        "nodes",
        "rounds",
        "est_seconds",
        "slow_true",
        "flagged",
        "missed",
        "false_positives",
        "slow_links_measured",
        "slow_links_flagged",
    } <= set(out)
    assert out["nodes"] == 64 and len(out["slow_true"]) == 1 and out["flagged"] == out["slow_true"]
    assert scale.main(["--nodes", "3", "--slow-nodes", "1", "--slow-links", "2"]) == 2
    assert "bad --slow-links 2" in capsys.readouterr().err


# --- the store exchange, nodes as threads ---------------------------------------------------


class _Link:
    def __init__(self, rank: int, links: dict[int, _Link], slow: int) -> None:
        self.rank, self.links, self.slow, self._received = rank, links, slow, {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{20000 + self.rank}"

    @property
    def received(self) -> dict[int, float]:
        return self._received

    def stream(self, peer_address: str, peer: int) -> None:
        assert peer_address == self.links[peer].address
        self.links[peer]._received[self.rank] = 0.1 if self.slow in (self.rank, peer) else 1.0


class _Counting:
    def __init__(self, store: Any) -> None:
        self.store, self.keys = store, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any) -> Any:
            first = args[0] if args else []
            self.keys += len(first) if isinstance(first, list) else 1
            return method(*args)

        return counted


def _exchange(n: int, slow: int) -> tuple[list[dict[str, Any]], list[int]]:
    # one in-process store shared by the node threads: the same calls as a TCPStore's clients
    # make (scripts/bench_store_gather.py times those), without a socket per node
    from torch.distributed import HashStore

    shared = HashStore()
    stores = [_Counting(shared) for _ in range(n)]
    links: dict[int, _Link] = {}
    for r in range(n):
        links[r] = _Link(r, links, slow)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def node(r: int) -> None:
        try:
            sync = StoreSync(stores[r], rank=r, nnodes=n, timeout_s=60)
            results[r] = run_exchange(
                sync,
                links[r],
                _report(r),
                schedule=LinkSchedule.BOUNDED,
                min_link_fraction=0.5,
                t0=time.perf_counter(),
                seed=9,
            )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results, [s.keys for s in stores]


def test_store_exchange_names_the_slow_node_and_each_node_names_few_keys():
    small, keys_small = _exchange(8, slow=3)
    large, keys_large = _exchange(64, slow=3)
    for results in (small, large):
        head = results[0]
        assert head["slow_nodes"] == [3] and head["slow_links"] == [] and head["ok"] is False
        assert head["links"]["schedule"]["name"] == "bounded" and head["links"]["schedule"]["rounds"] <= MAX_ROUNDS
        assert len(head["nodes"]) == len(results)
        assert all(r["slow_nodes"] == [3] and "nodes" not in r for r in results[1:])
    # a node other than 0 names a bounded number of keys whatever the node count; node 0 in proportion to it
    assert max(keys_large[1:]) <= max(keys_small[1:]) + 4
    assert keys_large[0] <= keys_small[0] * 64 / 8 + 40


def test_link_schedule_is_checked_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["doctor", "--link-schedule", "some-pairs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert len(err) == 1 and "bad --link-schedule 'some-pairs'" in err[0] and "all-pairs" in err[0]


def test_report_of_many_nodes_lists_the_notable_ones_and_collapses_shared_findings():
    from numarun.doctor.render import render

    n = 100
    recv = {r: {(r + 1) % n: 1.0, (r - 1) % n: 1.0} for r in range(n)}
    for r in (6, 8):  # node 7 is slow to both its peers
        recv[r][7] = recv[7][r] = 0.05
    smt = (Finding(Severity.INFO, "smt", "cpu", "SMT is off"),)
    reports = [
        NodeReport(r, f"host{r}", smt, {}, {"recv_gbs": {str(k): v for k, v in recv[r].items()}}) for r in range(n)
    ]
    text = render(judge(reports, min_link_fraction=0.5))
    assert judge(reports, min_link_fraction=0.5)["slow_nodes"] == [7]
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert [line.split("│")[1].strip() for line in rows[:1]] == ["7"]  # the nodes table: the slow node alone
    assert "99 more nodes without an error or a warning" in text
    smt_rows = [line for line in rows if "SMT is off" in line]
    assert len(smt_rows) == 1 and smt_rows[0].split("│")[1].strip() == "0-99"
