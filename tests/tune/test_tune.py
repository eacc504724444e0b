"""numarun tune's pure parts: candidates, alternation, statistics, measurement parsing, chart."""

from __future__ import annotations

import json
import xml.dom.minidom

import pytest

from numarun.errors import UsageError
from numarun.tune import candidates as cand
from numarun.tune.chart import render_chart
from numarun.tune.measure import from_metrics, from_reports
from numarun.tune.schedule import alternate
from numarun.tune.stats import Run, best, summarize, table, to_json


def test_axes_parse_and_product_order() -> None:
    axes = [cand.binding_axis("exclusive,node,none"), cand.mem_policy_axis("bind,preferred")]
    cs = cand.candidates(axes)
    assert [c.label() for c in cs[:3]] == [
        "binding=exclusive mem-policy=bind",
        "binding=exclusive mem-policy=preferred",
        "binding=node mem-policy=bind",
    ]
    assert len(cs) == 6
    base = {"binding": "exclusive", "mem-policy": "bind"}
    assert cand.default_index(cs, axes, base) == 0
    two = [cand.binding_axis("none,exclusive")]
    assert cand.default_index(cand.candidates(two), two, base) == 1
    # what the runs take without --binding, from the environment (NUMARUN_BINDING=none): the ratios' base
    assert cand.default_index(cand.candidates(two), two, {**base, "binding": "none"}) == 0


@pytest.mark.parametrize(
    "flag,text",
    [
        ("binding", "exclusive,fast"),
        ("binding", ""),
        ("binding", "node,,none"),
        ("binding", "node,node"),
        ("mem", "bind,strict"),
        ("omp", "4,0"),
        ("omp", "four"),
        ("omp", "-1"),
    ],
)
def test_bad_lists_name_the_value(flag: str, text: str) -> None:
    parse = {"binding": cand.binding_axis, "mem": cand.mem_policy_axis, "omp": cand.omp_axis}[flag]
    with pytest.raises(UsageError) as e:
        parse(text)
    assert repr(text) in str(e.value) and "expected" in str(e.value)


def test_override_axes_keep_other_args() -> None:
    axes, rest = cand.override_axes(
        ["trainer.batch_size=16,32,64", "model=gpt", "--flag", "x=[1,2]", "trainer.compile=true,false"]
    )
    assert [(a.name, a.values) for a in axes] == [
        ("trainer.batch_size", ("16", "32", "64")),
        ("trainer.compile", ("true", "false")),
    ]
    assert rest == ["model=gpt", "--flag", "x=[1,2]"]  # a list value is Hydra's, not a sweep
    cs = cand.candidates(axes)
    assert cs[0].overrides() == ["trainer.batch_size=16", "trainer.compile=true"]
    with pytest.raises(UsageError):
        cand.override_axes(["a=1,2", "a=3,4"])


def test_the_base_is_what_a_run_takes_without_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.commands import tune

    assert tune._baseline({}).binding.value == "exclusive"  # numarun's own default, as declared
    assert tune._baseline({"NUMARUN_BINDING": "node", "NUMARUN_MEM_POLICY": "none"}).binding.value == "node"


def test_omp_default_is_the_plan() -> None:
    axes = [cand.omp_axis("4,plan")]
    assert cand.default_index(cand.candidates(axes), axes, {}) == 1


@pytest.mark.parametrize("n,k", [(1, 1), (3, 3), (4, 2), (2, 5)])
def test_alternate_runs_each_once_per_round_rotated(n: int, k: int) -> None:
    order = alternate(n, k)
    assert len(order) == n * k
    for r in range(k):
        assert sorted(i for rr, i in order if rr == r) == list(range(n))
    if k >= n:  # every candidate takes every position in a round at least once
        for c in range(n):
            assert {[i for rr, i in order if rr == r].index(c) for r in range(k)} == set(range(n))


def _runs(tp: list[float | None], secs: list[float], unit: str = "samples/s") -> list[Run]:
    return [Run(seconds=s, throughput=t, unit=unit if t is not None else "s") for t, s in zip(tp, secs)]


def test_summary_by_throughput_and_json_shape() -> None:
    cs = cand.candidates([cand.binding_axis("exclusive,none")])
    runs = [_runs([10, 12, 11], [3, 3, 3]), _runs([20, 22, 1], [3, 3, 3])]
    s = summarize(cs, runs, default=0)
    assert s[0].throughput == 11 and s[1].throughput == 20
    assert s[1].ratio == pytest.approx(20 / 11)
    assert s[1].spread == (1, 22)
    w = best(s)
    assert w == 1
    j = to_json(s, default=0, winner=w, trials=3)
    json.dumps(j)
    assert j["best"]["options"] == {"binding": "none"}
    assert set(j["candidates"][0]) >= {"options", "runs_s", "median_s", "throughput"}
    assert j["candidates"][0]["runs_s"] == [3, 3, 3]
    head, rule, *rows = table(s, default=0, winner=w).splitlines()
    assert head.split() == ["candidate", "median", "samples/s", "range", "median", "s", "peak", "MiB", "vs", "default"]
    assert set(rule) == {"─"} and len(rule) == len(head)  # rich's rule under the header
    assert rows[0].split() == ["binding=exclusive", "(default)", "11", "10-12", "3.000", "-", "1.000x"]
    assert rows[1].split() == ["binding=none", "*best*", "20", "1-22", "3.000", "-", "1.818x"]
    assert {len(r) for r in rows} == {len(head)}  # numbers right-aligned under their headers


def test_summary_by_time_when_throughput_missing() -> None:
    cs = cand.candidates([cand.binding_axis("exclusive,none")])
    runs = [_runs([None, None], [2.0, 4.0]), _runs([None, None], [1.0, 2.0])]
    s = summarize(cs, runs, default=0)
    assert s[0].throughput is None and s[0].unit == "s"
    assert s[1].ratio == pytest.approx(3.0 / 1.5)
    assert best(s) == 1


def test_ties_go_to_the_earlier_candidate() -> None:
    cs = cand.candidates([cand.binding_axis("node,exclusive")])
    s = summarize(cs, [_runs([5], [1]), _runs([5], [1])], default=1)
    assert best(s) == 0


def test_metrics_median_after_the_first_step_and_peak() -> None:
    text = (
        "\n".join(
            json.dumps(r)
            for r in [
                {"step": 1, "tokens_per_s": 1.0, "samples_per_s": 0.1, "peak_mem_mb": [10, 12]},
                {"step": 2, "tokens_per_s": 100.0, "peak_mem_mb": [11, 30]},
                {"step": 3, "tokens_per_s": 120.0, "peak_mem_mb": [11, 13]},
                {"step": 4, "tokens_per_s": 110.0},
            ]
        )
        + "\n{cut"
    )
    m = from_metrics(text)
    assert m is not None and m.unit == "tokens/s" and m.throughput == 110.0 and m.peak_mem_mb == 30
    m2 = from_metrics(json.dumps({"samples_per_s": 7.0}))
    assert m2 is not None and m2.unit == "samples/s" and m2.throughput == 7.0
    assert from_metrics("") is None


def test_reports_sum_rank_rates() -> None:
    lines = [
        {"rank": "0", "samples": 10, "seconds": 1},
        {"rank": "0", "samples": 10, "seconds": 1},
        {"rank": "1", "samples": 30, "seconds": 2},
        {"rank": "1", "samples": 5, "seconds": 0},
    ]
    m = from_reports("\n".join(json.dumps(x) for x in lines))
    assert m is not None and m.throughput == pytest.approx(10 + 15)
    assert from_reports("") is None


def test_chart_is_svg_with_a_bar_per_candidate() -> None:
    cs = cand.candidates([cand.binding_axis("exclusive,node,none")])
    s = summarize(cs, [_runs([3, 4], [1, 1]), _runs([5, 6], [1, 1]), _runs([1, 2], [1, 1])], default=0)
    svg = render_chart(s, default=0, winner=best(s))
    doc = xml.dom.minidom.parseString(svg)
    bars = [
        r
        for r in doc.getElementsByTagName("rect")
        if r.getAttribute("height") != doc.documentElement.getAttribute("height")
    ]
    assert len(bars) == 3
    widths = [float(b.getAttribute("width")) for b in bars]
    assert widths[1] > widths[0] > widths[2]
    assert "binding=node" in svg and "(default)" in svg
