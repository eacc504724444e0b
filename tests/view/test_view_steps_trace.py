"""The step report as a Chrome trace (numarun.view.steps_trace), checked against the trace event format's rules.

The rules (the Trace Event Format document, the format Perfetto's and chrome://tracing's JSON importers read): the
JSON object form holds ``traceEvents`` (a list) and optionally ``displayTimeUnit`` (``ms`` or ``ns``); every event
has a ``ph``, a ``name``, an integer ``pid``; a complete event (``X``) has an integer ``tid``, a number ``ts`` and a
number ``dur`` (microseconds) and ``args`` an object when present; a metadata event (``M``) is ``process_name``,
``thread_name`` (``args.name`` a string), ``process_sort_index`` or ``thread_sort_index`` (``args.sort_index`` an
integer), thread ones with a ``tid``; a counter (``C``) has a ``ts`` and ``args`` of numbers. Complete events of one
thread must nest: each lies within the one it starts in, or begins after it ends.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from numarun.view.steps_trace import chrome_trace
from numarun.worker.steps import PHASES, RankPlace, StepRecord

PHASE_S = {"input": 0.002, "compute": 0.03, "comm": 0.015, "optim": 0.003}
METADATA = {
    "process_name": "name",
    "thread_name": "name",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def violations(trace: Any) -> list[str]:
    """What in ``trace`` breaks the trace event format's rules (empty: none)."""
    bad: list[str] = []
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as e:
        return [f"not JSON: {e}"]
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not the object form: no traceEvents list"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        bad.append(f"displayTimeUnit {trace['displayTimeUnit']!r}")
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for i, e in enumerate(trace["traceEvents"]):
        where = f"event {i} {e.get('name')!r}"
        if not isinstance(e.get("name"), str) or not isinstance(e.get("ph"), str) or not _integer(e.get("pid")):
            bad.append(f"{where}: name, ph (strings) and pid (integer) are required")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            bad.append(f"{where}: args is not an object")
        ph = e["ph"]
        if ph == "X":
            if not (_integer(e.get("tid")) and _number(e.get("ts")) and _number(e.get("dur"))):
                bad.append(f"{where}: a complete event needs tid, ts and dur numbers")
            elif e["ts"] < 0 or e["dur"] < 0:
                bad.append(f"{where}: negative ts or dur")
            else:
                slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph == "M":
            key = METADATA.get(e["name"])
            value = (e.get("args") or {}).get(key) if key else None
            if key is None or not (isinstance(value, str) if key == "name" else _integer(value)):
                bad.append(f"{where}: a metadata event of an unknown name or without its args.{key}")
            if e["name"].startswith("thread_") and not _integer(e.get("tid")):
                bad.append(f"{where}: a thread's metadata without tid")
        elif ph == "C":
            if not _number(e.get("ts")) or not e.get("args") or not all(_number(v) for v in e["args"].values()):
                bad.append(f"{where}: a counter needs ts and numeric args")
        else:
            bad.append(f"{where}: phase {ph!r} is not one this trace should hold")
    for thread, events in slices.items():
        open_: list[tuple[float, float, str]] = []
        for start, end, name in sorted(events, key=lambda s: (s[0], -s[1])):
            while open_ and start >= open_[-1][1]:
                open_.pop()
            if open_ and end > open_[-1][1]:
                bad.append(f"thread {thread}: {name!r} [{start}, {end}] overlaps {open_[-1][2]!r} without nesting")
            open_.append((start, end, name))
    return bad


def _records(ranks: int, steps: int, *, clock=lambda rank: 50.0, phases=PHASE_S) -> list[StepRecord]:
    out = []
    for rank in range(ranks):
        t = clock(rank)
        for step in range(1, steps + 1):
            wall = sum(PHASE_S.values())
            out.append(
                StepRecord(
                    rank=rank,
                    step=step,
                    start=t,
                    end=t + wall,
                    **{f"{p}_s": s for p, s in phases.items()},
                    peak_bytes=1000 * min(step, 3),
                    extra={"ddp_comm_s": 0.001},
                )
            )
            t += wall
    return out


def _places(ranks: int, per_node: int) -> dict[int, RankPlace]:
    return {
        r: RankPlace(rank=r, local_rank=r % per_node, node_rank=r // per_node, host=f"h{r // per_node}", cpus=f"{r}")
        for r in range(ranks)
    }


def _events(trace: dict[str, Any], ph: str, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph and (name is None or e["name"] == name)]


def test_a_trace_of_two_nodes_follows_the_format_one_process_a_node_one_thread_a_rank() -> None:
    places = _places(4, per_node=2)
    trace = chrome_trace(_records(4, 6, clock=lambda rank: 50.0 + 9000 * (rank // 2)), places)
    assert violations(trace) == []
    assert trace["displayTimeUnit"] == "ms"
    names = {e["pid"]: e["args"]["name"] for e in _events(trace, "M", "process_name")}
    assert names == {0: "node 0 (h0)", 1: "node 1 (h1)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events(trace, "M", "thread_name")}
    assert threads == {(r // 2, r): places[r].label() for r in range(4)}
    steps = [e for e in _events(trace, "X") if e["cat"] == "step"]
    assert len(steps) == 4 * 6 and {e["name"] for e in steps} == {f"step {i}" for i in range(1, 7)}
    # each node starts at 0 on its own axis: the other host's clock is never compared
    assert min(e["ts"] for e in steps if e["pid"] == 1) == 0 == min(e["ts"] for e in steps if e["pid"] == 0)
    args = steps[0]["args"]
    assert {k: args[f"{k}_s"] for k in PHASES} == PHASE_S and args["peak_bytes"] == 1000 and args["ddp_comm_s"] == 0.001
    assert "the record keeps no order" in args["phase_order"]


def test_phases_lie_back_to_back_in_order_within_their_step() -> None:
    trace = chrome_trace(_records(1, 3), _places(1, 1))
    xs = _events(trace, "X")
    step2 = next(e for e in xs if e["name"] == "step 2")
    inside = [e for e in xs if e["cat"] == "phase" and step2["ts"] <= e["ts"] < step2["ts"] + step2["dur"]]
    assert [e["name"] for e in inside] == list(PHASES)
    assert inside[0]["ts"] == step2["ts"]
    assert all(a["ts"] + a["dur"] == b["ts"] for a, b in zip(inside, inside[1:]))
    assert [e["dur"] for e in inside] == [round(PHASE_S[p] * 1e6) for p in PHASES]
    # consecutive steps share their boundary exactly (one clock reading)
    step1 = next(e for e in xs if e["name"] == "step 1")
    assert step1["ts"] + step1["dur"] == step2["ts"]
    # the peak counter has a point where the peak changed, not one a step
    assert [e["args"]["bytes"] for e in _events(trace, "C")] == [1000, 2000, 3000]


def test_phase_totals_above_the_wall_and_a_stepped_clock_still_nest() -> None:
    """Phases summing to more than the step (rounding) are scaled into it; a step starting before its predecessor
    ended (a clock that stepped back) starts at that end: siblings never overlap."""
    big = dict(PHASE_S, compute=0.2)
    records = _records(1, 2, phases=big)
    stepped = StepRecord(rank=0, step=3, start=records[-1].end - 0.01, end=records[-1].end + 0.05, compute_s=0.06)
    trace = chrome_trace([*records, stepped], _places(1, 1))
    assert violations(trace) == []
    xs = _events(trace, "X")
    step1 = next(e for e in xs if e["name"] == "step 1")
    phases = [e for e in xs if e["cat"] == "phase" and step1["ts"] <= e["ts"] < step1["ts"] + step1["dur"]]
    assert sum(e["dur"] for e in phases) <= step1["dur"] and phases[-1]["name"] == "optim"


def test_the_checker_catches_what_it_checks() -> None:
    """The rules above fail a trace that breaks them: a phase past its step, a missing pid, a float pid, NaN."""
    trace = chrome_trace(_records(1, 1), _places(1, 1))
    step = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "step")
    phase = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "phase")
    cases = [
        ({**phase, "ts": step["ts"] + 10, "dur": step["dur"], "name": "late"}, "overlaps"),
        ({k: v for k, v in step.items() if k != "pid"}, "pid (integer) are required"),
        ({**step, "pid": 0.5}, "pid (integer) are required"),
        ({**step, "ts": float("nan")}, "not JSON"),
        ({"name": "thread_name", "ph": "M", "pid": 0, "args": {"name": "x"}}, "without tid"),
    ]
    for event, why in cases:
        broken = {**trace, "traceEvents": [*trace["traceEvents"], event]}
        assert any(why in v for v in violations(broken)), (event, violations(broken))


@pytest.mark.parametrize("records", [[], [StepRecord(rank=5, step=1, start=1.0, end=1.0)]])
def test_no_steps_or_an_empty_one_and_a_rank_without_a_place(records: list[StepRecord]) -> None:
    trace = chrome_trace(records, {})
    assert violations(trace) == []
    if records:
        assert _events(trace, "M", "thread_name")[0]["args"]["name"] == "rank 5"
        assert [e["dur"] for e in _events(trace, "X")] == [0]
