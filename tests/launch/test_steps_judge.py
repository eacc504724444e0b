"""The step report's verdict, its causes and its words, on constructed steps (docs/steps.md): a straggler is named
with the phase it loses time in, a balanced job never is (noisy or not), and a cause is named only when the
kernel's figures cover most of the lost time."""

from __future__ import annotations

import random

import pytest

from numarun.launch.steps.cause import explain, ms
from numarun.launch.steps.evidence import Busy, Evidence
from numarun.launch.steps.judge import NAME_SHARE, WINDOW, Judgement, Point, judge, window
from numarun.launch.steps.report import summary_lines, verdict_lines
from numarun.worker.steps import RankPlace, RankRow


def _steps(
    ranks: int,
    n: int,
    *,
    work: float = 0.050,
    slow: int | None = None,
    extra: float = 0.0,
    phase: str = "compute",
    noise: float = 0.0,
    seed: int = 0,
) -> dict[int, list[Point]]:
    """A synchronous job: each step every rank works ``work`` (rank ``slow`` ``extra`` more, in ``phase``), with
    multiplicative noise; every rank's step ends when the slowest is done, the others wait in comm."""
    rng = random.Random(seed)
    out: dict[int, list[Point]] = {r: [] for r in range(ranks)}
    for step in range(1, n + 1):
        own = {}
        for r in range(ranks):
            base = work * (1 + rng.uniform(-noise, noise))
            more = extra if r == slow else 0.0
            own[r] = (base, more)
        wall = max(b + m for b, m in own.values()) + 0.002
        for r, (base, more) in own.items():
            inp = 0.001 + (more if phase == "input" else 0.0)
            opt = 0.001 + (more if phase == "optim" else 0.0)
            comp = base - 0.002 + (more if phase == "compute" else 0.0)
            out[r].append(Point(step, wall, inp, comp, wall - inp - comp - opt, opt))
    return out


@pytest.mark.parametrize("phase", ["input", "compute", "optim"])
def test_a_straggler_is_named_with_the_phase_it_loses_time_in(phase: str) -> None:
    j = judge(_steps(4, 40, slow=2, extra=0.030, phase=phase, noise=0.1))
    assert j.culprit == 2 and j.phase == phase
    assert j.lost_s == pytest.approx(0.030, rel=0.25) and j.share == pytest.approx(0.030 / j.step_s, rel=0.25)
    assert j.behind == 1.0 and j.chance < 1e-9 and j.steps == 39  # step 1 (the rank's start) left out


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_balanced_job_never_gets_a_culprit_however_noisy(ranks: int) -> None:
    """Each rank's work varies by up to ±60 % from step to step (a host loaded several times over): no rank is
    named in any of 200 seeded jobs."""
    named = [s for s in range(200) if judge(_steps(ranks, 30, noise=0.6, seed=s)).culprit is not None]
    assert named == []


def test_a_straggler_below_a_tenth_of_the_step_is_not_named_and_its_cost_is_said() -> None:
    j = judge(_steps(2, 40, slow=1, extra=0.004))
    assert j.culprit is None and j.slowest == 1 and 0.05 < j.share < NAME_SHARE
    assert verdict_lines(j, None, {}) == [
        f"=> no rank holds the job back (the slowest, rank 1, costs {round(j.share * 100)} % of a step)"
    ]


def test_too_few_steps_or_a_rank_slowest_only_now_and_then_is_not_named() -> None:
    j = judge(_steps(2, 10, slow=1, extra=0.030))
    assert j.culprit is None and j.slowest == 1 and "fewer than 12" in j.reason
    assert verdict_lines(j, None, {})[0].startswith("=> too few steps to judge which rank holds the job back")
    # rank 1 is far slower in a third of the steps, its median is still above: not the rank the others wait for
    # step after step
    points = _steps(2, 40)
    for i, p in enumerate(points[1]):
        if i % 3 == 0:
            points[1][i] = Point(p.step, p.wall + 0.2, p.input, p.compute + 0.2, p.comm, p.optim)
    assert judge(points).culprit is None
    one = judge({0: _steps(1, 20)[0]})
    assert one.culprit is None and one.slowest is None and one.steps == 19


def test_the_window_is_the_latest_steps_every_rank_recorded() -> None:
    points = _steps(2, 100, slow=1, extra=0.030)
    points[0] = points[0][:90]  # rank 0 is behind by ten records
    j = judge(points)
    assert j.steps == WINDOW and j.culprit == 1
    assert window(points)[1][-1].step == 90


# ----------------------------------------------------------------------------- causes


def _ev(rank: int, **kw: object) -> Evidence:
    base: dict[str, object] = dict(
        span_s=10.0, cpus=str(rank), numa=0, threads=4, run=0.5, main_run=0.5, main_wait=0.02
    )
    base.update(kw)
    return Evidence(rank=rank, **base)  # type: ignore[arg-type]


def _compute_straggler() -> Judgement:
    j = judge(_steps(2, 40, work=0.050, slow=1, extra=0.050))
    assert j.culprit == 1 and j.step_s == pytest.approx(0.102, abs=0.002)
    return j


def test_a_shared_core_names_the_process_by_pid_and_command() -> None:
    """The rank's main thread waited for a CPU about as long as it lost, in proportion far above the others', and a
    process outside the job ran on its core."""
    j = _compute_straggler()
    spinner = Busy(4242, "python3 -c while True: pass", 0.49, "1")
    ev = {0: _ev(0, main_run=0.5, main_wait=0.02), 1: _ev(1, main_run=0.49, main_wait=0.47, others=(spinner,))}
    cause = explain(j, ev)
    assert cause.found and cause.why.startswith("a shared core: pid 4242 (python3 -c while True: pass) ran 49 %")
    assert "waited 48 ms a step for a CPU (its cpus 1)" in cause.why
    assert cause.fix == "free its cores: stop or move pid 4242 off cpus 1 (taskset -p)"
    lines = verdict_lines(j, cause, {})
    assert lines[0] == (
        "=> rank 1 holds the job back: compute, 50 ms a step above the other ranks; the job's step would be "
        f"{round(j.share * 100)} % shorter at their pace"
    )
    assert lines[1] == f"   why: {cause.why}" and lines[2] == f"   fix: {cause.fix}"
    alone = explain(j, {0: ev[0], 1: _ev(1, main_run=0.49, main_wait=0.47)}, bound=False)
    assert alone.found and alone.why.startswith("CPU wait: its main thread waited 48 ms a step for a CPU (4 threads")
    assert alone.fix == "--binding (cores of its own for each rank)"


def test_more_work_is_not_taken_for_a_shared_core_on_a_host_that_is_busy_everywhere() -> None:
    """Every rank waits half as long as it runs (a loaded host): the straggler waits more because it runs more."""
    j = _compute_straggler()
    ev = {0: _ev(0, main_run=0.33, main_wait=0.165), 1: _ev(1, main_run=0.66, main_wait=0.33)}
    cause = explain(j, ev)
    assert cause.found and cause.why.startswith("more work: its main thread ran 67 ms a step on a CPU, the other")
    assert cause.fix == ""


def test_slower_cores_remote_memory_and_steal() -> None:
    j = _compute_straggler()
    ran = dict(main_run=0.99, main_wait=0.01)
    slower = explain(j, {0: _ev(0, main_run=0.5, mhz=3000.0), 1: _ev(1, **ran, mhz=1500.0, throttled=12)})
    assert slower.found and slower.why == (
        "slower cores: its cores ran at 1500 MHz, the other ranks' at 3000 MHz, throttled 12 times"
    )
    remote = explain(j, {0: _ev(0, main_run=0.5, remote=0.02), 1: _ev(1, **ran, remote=0.7)})
    assert remote.found and remote.why.startswith("remote memory: 70 % of its pages are on NUMA nodes other than")
    assert remote.fix == "--mem-policy bind (each rank's memory on its own node)"
    stolen = explain(j, {0: _ev(0, steal=0.01), 1: _ev(1, main_run=0.5, steal=0.55)})
    assert stolen.found and stolen.why == "steal: the VM's host took 55 % of its cores' time (the other ranks' 1 %)"


def test_input_causes_from_the_loader_workers() -> None:
    j = judge(_steps(2, 40, slow=0, extra=0.040, phase="input"))
    assert j.culprit == 0 and j.phase == "input"
    ev = {0: _ev(0, main_run=0.2, children=4, children_cpu=3.9, children_cpus="0-3"), 1: _ev(1)}
    main = explain(j, ev, workers={0: 0, 1: 0})
    assert main.found and main.why.startswith("it loads its batches in its main thread (DataLoader num_workers=0): ")
    assert main.fix == "more loader workers (DataLoader num_workers)"
    busy = explain(j, ev, workers={0: 4, 1: 4})
    assert busy.found and busy.why.startswith("its 4 loader workers cannot keep up: 98 % of a core each, on cpus 0-3")
    unsampled = explain(j, {}, workers={0: 0})  # a job too short for the kernel's figures: its records suffice
    assert unsampled.found and unsampled.fix == "more loader workers (DataLoader num_workers)"
    idle = explain(j, {0: _ev(0, main_run=0.2, children=4, children_cpu=0.4), 1: _ev(1)}, workers={0: 4})
    assert not idle.found and idle.why.startswith("cause not found: ") and "10 % of a core each" in idle.why


def test_cause_not_found_says_the_figures() -> None:
    j = _compute_straggler()
    cause = explain(j, {0: _ev(0), 1: _ev(1, nic="NCCL_IB_HCA==mlx5_3, the plan's =mlx5_0")})  # nothing stands out
    assert not cause.found and cause.why.startswith("cause not found: compute 50 ms a step above the other ranks'")
    assert "steal 0 %" in cause.why and cause.why.endswith(
        "its NIC is not the one next to its GPU: NCCL_IB_HCA==mlx5_3, the plan's =mlx5_0"
    )
    assert verdict_lines(j, cause, {})[1] == f"   why: {cause.why}"
    assert explain(j, {0: _ev(0)}).why.startswith("cause not found: the kernel's figures of the rank were not sampled")


def test_ms() -> None:
    assert [ms(x) for x in (0.00042, 0.0123, 0.5, 1.25, 12.0)] == ["0.4 ms", "12 ms", "500 ms", "1.2 s", "12 s"]


# ----------------------------------------------------------------------------- the summary


def test_the_summary_gives_each_phase_for_the_slowest_rank_and_the_others_and_the_verdict() -> None:
    j = _compute_straggler()
    places = {r: RankPlace(r, r, 0, "h", str(r), 0) for r in range(2)}
    rows = [
        RankRow(places[r], 100 + r, 40, j.step_s, j.phases[r], peak_bytes=(300 + r) << 20, state="exited")
        for r in range(2)
    ]
    lines = summary_lines(j, None, rows, places=places, pace=9.8)
    assert lines[0] == "step report: 40 steps of 2 ranks, 9.8 steps/s, a step 102 ms"
    assert lines[1].split() == ["share", "of", "a", "step", "rank", "1", "(slowest)", "the", "others", "(median)"]
    compute = lines[3].split()
    assert compute[0] == "compute" and int(compute[1]) > 90 and int(compute[3]) < 50
    assert lines[6].split() == ["peak", "memory", "301", "MiB", "300", "MiB"]
    assert lines[7].startswith("=> rank 1 holds the job back: compute")
    multi = verdict_lines(j, None, {1: RankPlace(1, 1, 1, "nodeB", "")}, multi_node=True)
    assert multi[0].startswith("=> rank 1 (node 1, nodeB) holds the job back")
