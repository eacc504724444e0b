"""Pure parts of the hierarchical layer: rank lists, byte-count bounds, config parsing, bench CLI."""

from __future__ import annotations

import argparse
import itertools

import pytest

from numarun.bench import allreduce as bench
from numarun.comm.allreduce import CommMode, Compression, parse_comm_mode, parse_compression
from numarun.comm.groups import RankOnNode, layout_from_places
from numarun.commands import bench as bench_cmd
from numarun.errors import ConfigError, HierarchyError, NumarunError, UsageError
from numarun.launch.child import numarun_command


@pytest.mark.parametrize("n,g", [(1, 1), (1, 4), (2, 2), (2, 3), (3, 2), (4, 8)])
def test_contiguous_layout_matches_torchrun_numbering(n: int, g: int) -> None:
    lay = layout_from_places([(r // g, r % g) for r in range(n * g)])  # torchrun: node n holds n*G .. n*G+G-1
    assert lay.num_nodes == n and lay.local_world_size == g and lay.uniform
    # every rank is in exactly one intra and one inter group, and they meet only at that rank
    for rank in range(n * g):
        intra, inter = lay.intra_of(rank), lay.inter[lay.places[rank].local_rank]
        assert set(intra) & set(inter) == {rank}
        assert all(r // g == rank // g for r in intra)
        assert all(r % g == rank % g for r in inter)
    assert sorted(itertools.chain(*lay.intra)) == list(range(n * g))
    assert sorted(itertools.chain(*lay.inter)) == list(range(n * g))
    assert [len(x) for x in lay.inter] == [n] * g


def test_layout_from_reported_places_not_contiguous() -> None:
    # ranks interleaved across nodes: groups follow what ranks report, ordered by local/node rank
    places = [(0, 0), (1, 0), (0, 1), (1, 1)]
    lay = layout_from_places(places)
    assert lay.intra == ((0, 2), (1, 3))
    assert lay.inter == ((0, 1), (2, 3))
    assert lay.places[3] == RankOnNode(1, 1)


def test_unequal_nodes_have_intra_groups_but_hierarchy_is_an_error() -> None:
    lay = layout_from_places([(0, 0), (0, 1), (1, 0)])
    assert lay.intra == ((0, 1), (2,))
    assert lay.inter == ()
    assert not lay.uniform
    with pytest.raises(HierarchyError, match=r"2,1 ranks.*same number of ranks"):
        lay.require_uniform()
    with pytest.raises(HierarchyError):
        lay.local_world_size  # noqa: B018 (the property raises)
    assert issubclass(HierarchyError, NumarunError)


@pytest.mark.parametrize(
    "places,match",
    [
        ([(0, 0), (0, 0)], "both claim node 0 local rank 0"),
        ([(0, 0), (2, 0)], r"node ranks \[0, 2\]"),
        ([(0, 0), (0, 2)], r"local ranks \[0, 2\] on node 0"),
        ([], "no ranks"),
    ],
)
def test_bad_places_are_named(places: list[tuple[int, int]], match: str) -> None:
    with pytest.raises(HierarchyError, match=match):
        layout_from_places(places)


@pytest.mark.parametrize("n,g", [(2, 2), (2, 4), (4, 2), (2, 8)])
def test_byte_count_bound(n: int, g: int) -> None:
    s = 64 * 2**20
    flat = bench.node_bytes(size_bytes=s, num_nodes=n, local_world_size=g, hierarchical=False)
    hier = bench.node_bytes(size_bytes=s, num_nodes=n, local_world_size=g, hierarchical=True)
    assert flat == pytest.approx(2 * (n * g - 1) / (n * g) * s)
    assert hier == pytest.approx(2 * (n - 1) / n * s)
    assert bench.bound_ratio(num_nodes=n, local_world_size=g) == pytest.approx(hier / flat)


def test_known_bounds_from_the_design() -> None:
    # DESIGN.md: at N=2, G=2 flat sends 1.5 S, hierarchical 1.0 S
    assert bench.node_bytes(size_bytes=4, num_nodes=2, local_world_size=2, hierarchical=False) == 6
    assert bench.node_bytes(size_bytes=4, num_nodes=2, local_world_size=2, hierarchical=True) == 4
    assert bench.bus_factor(8) == pytest.approx(1.75)
    assert bench.bus_factor(1) == 0.0


def test_summarize_is_nccl_tests_busbw() -> None:
    r = bench.summarize(size_bytes=10**9, mode="flat", times=[2.0, 1.0, 4.0], world_size=4)
    assert r.median_s == 2.0
    assert r.algbw_gbps == pytest.approx(0.5)
    assert r.busbw_gbps == pytest.approx(0.5 * 1.5)


def test_comparisons_against_link_bound() -> None:
    s = 16 * 2**20
    res = [
        bench.summarize(size_bytes=s, mode="flat", times=[1.0], world_size=4),
        bench.summarize(size_bytes=s, mode="hierarchical", times=[0.75], world_size=4),
    ]
    rate = 200e6
    (row,) = bench._comparisons(res, 2, 2, rate)
    assert row["ratio"] == pytest.approx(0.75)
    hier_link = s * 8 / rate  # 2(N-1)/N * S = S at N=2
    assert row["hierarchical_link_bound_s"] == pytest.approx(hier_link)
    assert row["hierarchical_over_bound"] == pytest.approx(0.75 / hier_link - 1)
    assert row["flat_link_bound_s"] == pytest.approx(1.5 * hier_link)


@pytest.mark.parametrize(
    "text,n", [("4096", 4096), ("16M", 16 * 2**20), ("1MiB", 2**20), ("2g", 2 * 2**30), ("3k", 3072)]
)
def test_parse_size(text: str, n: int) -> None:
    assert bench.parse_size(text) == n


@pytest.mark.parametrize("text", ["0", "12X", "-1M", "M", "1M,,zz"])
def test_parse_size_errors(text: str) -> None:
    with pytest.raises(UsageError, match="expected a positive size"):
        bench.parse_sizes(text)
    with pytest.raises(UsageError, match="comma-separated list"):
        bench.parse_sizes(",")


def test_parse_rate() -> None:
    assert bench.parse_rate("200mbit") == 200e6
    assert bench.parse_rate("1.5gbit") == 1.5e9
    with pytest.raises(UsageError, match="200mbit"):
        bench.parse_rate("fast")


def test_comm_config_parsing() -> None:
    assert parse_comm_mode("Hierarchical") is CommMode.HIERARCHICAL
    assert parse_compression(None) is Compression.NONE
    assert parse_compression("bf16") is Compression.BF16
    with pytest.raises(ConfigError, match="'ring'.*flat or hierarchical"):
        parse_comm_mode("ring")
    with pytest.raises(ConfigError, match="'int8'.*none, bf16 or fp16"):
        parse_compression("int8")


def test_hierarchical_all_reduce_without_init_is_a_clear_error() -> None:
    import torch

    from numarun.comm.allreduce import hierarchical_all_reduce

    with pytest.raises(NumarunError, match=r"numarun.init\(\)"):
        hierarchical_all_reduce(torch.ones(3))


def _bench_args(argv: list[str]) -> argparse.Namespace:
    from numarun.cli import build_parser

    return build_parser(only="bench").parse_args(argv)


def test_bench_launch_argv_forwards_bench_options_only() -> None:
    args = _bench_args(
        [
            "bench",
            "allreduce",
            "--nproc-per-node",
            "3",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "1234",
            "--sizes",
            "1M,2M",
            "--iters",
            "4",
            "--json",
            "--json-file",
            "/tmp/x.json",
        ]
    )
    argv = bench_cmd.launch_argv(args, bench_cmd.job_options(args), bench_cmd.bench_argv(args))
    head = numarun_command("run")
    i = argv.index("-m", len(head))
    assert argv[: len(head)] == head  # bound ranks by default
    assert argv[len(head) : i] == [
        "--nproc-per-node=3",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=1234",
    ]
    assert argv[i + 1] == "numarun.bench.allreduce"
    rest = argv[i + 2 :]
    assert "--sizes=1M,2M" in rest and "--iters=4" in rest and "--json" in rest and "--json-file=/tmp/x.json" in rest
    assert not any(a.startswith(("--nnodes", "--node-rank", "--master", "--nproc")) for a in rest)
    # what is forwarded parses back to the same benchmark options
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    again = p.parse_args(rest)
    assert (again.sizes, again.iters, again.json, again.json_file, again.modes) == (
        "1M,2M",
        4,
        True,
        "/tmp/x.json",
        args.modes,
    )


def test_bench_launchers() -> None:
    args = _bench_args(["bench", "allreduce", "--binding", "none"])
    argv = bench_cmd.launch_argv(args, bench_cmd.job_options(args), [])
    assert argv[: len(numarun_command("run"))] == numarun_command("run") and "--binding=none" in argv
    args = _bench_args(["bench", "allreduce", "--launcher", "torchrun"])
    argv = bench_cmd.launch_argv(args, bench_cmd.job_options(args), [])
    assert argv[1:3] == ["-m", "torch.distributed.run"] and not any(a.startswith("--binding") for a in argv)
    args = _bench_args(["bench", "allreduce", "--launcher", "torchrun", "--binding", "node"])
    with pytest.raises(UsageError, match="--launcher torchrun"):
        bench_cmd.launch_argv(args, bench_cmd.job_options(args), [])


def test_bench_runs_two_ranks_unless_told_and_leaves_the_environment_to_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NUMARUN_BINDING", "node")
    monkeypatch.setenv("PET_MASTER_PORT", "29999")
    args = _bench_args(["bench", "allreduce"])
    options = bench_cmd.job_options(args)
    s = options.setting("nproc_per_node")
    assert (s.value, str(s.source), s.where) == (2, "default", "numarun bench")
    assert options.setting("binding").where == "NUMARUN_BINDING"
    argv = bench_cmd.launch_argv(args, options, [])
    # the job reads the environment itself: nothing of it becomes a flag
    assert not any(a.startswith(("--binding", "--master-port")) for a in argv) and "--nproc-per-node=2" in argv
    args = _bench_args(["bench", "allreduce", "--launcher", "torchrun"])
    bench_cmd.launch_argv(args, bench_cmd.job_options(args), [])  # NUMARUN_BINDING is no --binding for torchrun


def test_bench_bad_job_shape() -> None:
    args = _bench_args(["bench", "allreduce", "--nnodes", "2", "--node-rank", "2"])
    with pytest.raises(UsageError, match="node-rank"):
        bench_cmd.launch_argv(args, bench_cmd.job_options(args), [])


def test_bench_registry_names_importable_modules() -> None:
    import importlib

    for name, mod in bench_cmd.BENCHMARKS.items():
        m = importlib.import_module(mod)
        assert callable(m.add_arguments) and callable(m.run_and_report), name
