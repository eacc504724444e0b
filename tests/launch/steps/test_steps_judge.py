"""The step report's verdict, its causes and its words, on constructed steps (docs/steps.md): a straggler is named
with the phase it loses time in, a balanced job never is (noisy or not), and a cause is named only when the
kernel's figures cover most of the lost time."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from numarun.launch.steps.cause import explain
from numarun.launch.steps.evidence import Busy, Evidence
from numarun.launch.steps.judge import NAME_SHARE, WINDOW, Judgement, Point, judge, window
from numarun.launch.steps.report import summary_lines, verdict_lines
from numarun.view.steps_text import ms
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
    burst: Callable[[int, int], float] | None = None,
    clock: Callable[[int, int], float] | None = None,
    transfer: float = 0.002,
) -> dict[int, list[Point]]:
    """A synchronous job: each step every rank works ``work`` (rank ``slow`` ``extra`` more, in ``phase``), with
    multiplicative noise (and ``burst(rank, step)`` more: runs of slow steps); every rank's step ends when the slowest
    is done, the others wait in comm, and each rank's comm holds the last transfer too (0 to 1 ms, as a measured wait
    varies). ``clock(rank, step)``: how fast the rank's clock runs (1: as the others'); ``transfer``: the collectives'
    own time, in every rank's comm."""
    rng = random.Random(seed)
    out: dict[int, list[Point]] = {r: [] for r in range(ranks)}
    for step in range(1, n + 1):
        own = {}
        for r in range(ranks):
            base = work * (1 + rng.uniform(-noise, noise)) * (1 + (burst(r, step) if burst else 0.0))
            more = extra if r == slow else 0.0
            own[r] = (base, more)
        wall = max(b + m for b, m in own.values()) + transfer
        for r, (base, more) in own.items():
            inp = 0.001 + (more if phase == "input" else 0.0)
            opt = 0.001 + (more if phase == "optim" else 0.0)
            comp = base - 0.002 + (more if phase == "compute" else 0.0)
            comm = wall - inp - comp - opt + rng.uniform(0.0, 0.001)
            k = clock(r, step) if clock else 1.0
            out[r].append(Point(step, (inp + comp + comm + opt) * k, inp * k, comp * k, comm * k, opt * k))
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


def _bursts(ranks: int, n: int, *, runs: int, length: int, amp: float, seed: int) -> Callable[[int, int], float]:
    """Runs of slow steps: each rank ``runs`` bursts of ``length`` steps ``amp`` slower, at random places, every rank
    as many slow steps as the others (a balanced job whose noise comes in runs)."""
    rng = random.Random(seed)
    slow: dict[int, set[int]] = {}
    for r in range(ranks):
        steps: set[int] = set()
        while len(steps) < runs * length:
            first = rng.randint(1, n - length)
            steps |= set(range(first, first + length))
        slow[r] = steps
    return lambda r, step: amp if step in slow[r] else 0.0


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_balanced_job_whose_noise_comes_in_runs_gets_no_culprit(ranks: int) -> None:
    """Each rank is 80 % slower in three runs of 8 steps (a neighbour's burst, a checkpoint of its own...): in a
    window of 64 steps the rank whose runs fell in it is behind in a third of the steps in a row, which the sign test
    would take for 20 independent steps. Counted as runs, no rank is named in any of 200 seeded jobs."""
    named = [
        s
        for s in range(200)
        if judge(
            _steps(ranks, 70, noise=0.2, seed=s, burst=_bursts(ranks, 70, runs=3, length=8, amp=0.8, seed=s))
        ).culprit
        is not None
    ]
    assert named == []


def test_a_straggler_amid_runs_of_noise_is_still_named() -> None:
    """Rank 1 does twice the work every step, beside the same runs of noise on every rank: named in every job."""
    named = [
        judge(
            _steps(
                4, 70, noise=0.2, seed=s, slow=1, extra=0.050, burst=_bursts(4, 70, runs=3, length=8, amp=0.8, seed=s)
            )
        ).culprit
        for s in range(50)
    ]
    assert named == [1] * 50


def test_a_slowest_rank_behind_in_only_some_stretches_is_not_named_and_the_line_says_why() -> None:
    """Rank 1 is 50 % slower until step 54, then in turn 30 % slower and 60 % faster: behind in seven eighths of the
    window, far beyond chance (its signs hardly run together), but not in its last stretch. Not named, and the line
    says which test it failed; where its lead is what chance would give, the line says that instead."""

    def burst(rank: int, step: int) -> float:
        return 0.0 if rank != 1 else 0.5 if step <= 54 else (0.3 if step % 2 else -0.6)

    j = judge(_steps(2, 70, noise=0.05, seed=1, burst=burst))
    assert j.culprit is None and j.slowest == 1 and j.chance < 0.001, j
    line = verdict_lines(j, None, {})[0]
    assert line.startswith("=> no rank holds the job back steadily (the slowest, rank 1, costs "), line
    assert "of the steps, but not in each of 4 stretches of them: slow steps that came together" in line, line
    chance = verdict_lines(dataclasses.replace(j, chance=0.5), None, {})[0]
    assert chance.endswith("independent ones: chance would do as much)"), chance


def _held(points: dict[int, list[Point]], rank: int, every: int, share: float) -> dict[int, list[Point]]:
    """``rank``'s comm as a sampled figure: the value of one step in ``every`` (times ``share``: an unusual
    iteration), held until the next sample; its compute takes the rest of its step, as a recorder would charge it."""
    out = dict(points)
    held: list[Point] = []
    value = 0.0
    for i, p in enumerate(points[rank]):
        if i % every == 0:
            value = p.comm * share
        held.append(Point(p.step, p.wall, p.input, p.wall - p.input - value - p.optim, value, p.optim))
    out[rank] = held
    return out


def test_a_figure_held_for_a_hundred_steps_is_one_observation() -> None:
    """A balanced job with a 20 ms all-reduce whose rank 0 charges a sampled comm figure (a fifth of one step's, held
    for 100 steps): its own time looks longer in every step of the window, a culprit by the sign test if each step
    counted. The held figure is one observation: no culprit in any of 100 jobs, each said to be worth one or two."""
    judged = [judge(_held(_steps(2, 120, noise=0.3, seed=s, transfer=0.020), 0, 100, 0.2)) for s in range(100)]
    assert [j.culprit for j in judged] == [None] * 100
    assert {j.slowest for j in judged} == {0} and all(j.independent <= 2 for j in judged)
    line = verdict_lines(judged[0], None, {})[0]
    assert line.startswith("=> no rank holds the job back steadily (the slowest, rank 0, costs "), line
    assert "; it was behind the others in 100 % of the steps, as good as " in line, line
    assert line.endswith(" independent ones: chance would do as much)"), line
    fresh = judge(_held(_steps(2, 120, noise=0.3, seed=0, transfer=0.020), 0, 1, 0.2))  # measured anew every step
    assert fresh.culprit == 0


def test_a_rank_whose_clock_drifts_is_not_taken_for_a_slow_one() -> None:
    """Rank 1's clock runs faster and faster (up to 40 % by the end: another host's clock, seen as one host's): each of
    its figures is longer by as much, its step too. On the job's clock it is as fast as the others; a real straggler on
    that clock is still named."""
    drift = lambda r, step: 1 + 0.4 * step / 70 if r == 1 else 1.0  # noqa: E731
    assert [judge(_steps(2, 70, noise=0.2, seed=s, clock=drift)).culprit for s in range(100)] == [None] * 100
    assert judge(_steps(2, 70, noise=0.2, slow=1, extra=0.030, clock=drift)).culprit == 1


def test_the_verdict_states_the_step_and_names_a_phase_only_where_the_time_goes() -> None:
    """The lost time and the step stand side by side; a rank that loses its time in two phases alike is not said to
    lose it in either."""
    points = _steps(2, 40, slow=1, extra=0.015, phase="input")
    for i, p in enumerate(points[1]):  # as much again in compute
        points[1][i] = Point(p.step, p.wall, p.input, p.compute + 0.015, p.comm - 0.015, p.optim)
    j = judge(points)
    assert j.culprit == 1 and j.phase is None
    assert j.excess["input"] == pytest.approx(0.015, abs=1e-3) and j.excess["compute"] == pytest.approx(0.015, abs=2e-3)
    line = verdict_lines(j, None, {})[0]
    assert line == (
        f"=> rank 1 holds the job back: its own time, {ms(j.lost_s)} a step above the other ranks (input "
        f"{ms(j.excess['input'])}, compute {ms(j.excess['compute'])}); the job's step, {ms(j.step_s)}, would be "
        f"{round(j.share * 100)} % shorter at their pace"
    )
    assert j.lost_s == pytest.approx(0.030, abs=2e-3) and j.step_s == pytest.approx(0.0675, abs=2e-3)


def test_on_a_gpu_own_time_is_the_streams_and_host_spinning_is_not_work() -> None:
    """Rank 0's host spins in a synchronise while its stream waits for the others (its host's compute is long, its
    comm short); the stream's own time (its step's GPU time less its waits) shows it is as fast as they are. Rank 1's
    stream does 30 ms more work a step: named."""
    rng = random.Random(1)
    points = _steps(2, 40, seed=1)
    for r in (0, 1):
        points[r] = [dataclasses.replace(p, gpu_own=rng.uniform(0.049, 0.051) + 0.030 * r) for p in points[r]]
    points[0] = [
        dataclasses.replace(p, compute=p.compute + p.comm - 0.001, comm=0.001 * rng.random()) for p in points[0]
    ]
    j = judge(points)
    assert j.culprit == 1 and j.own[1] - j.own[0] == pytest.approx(0.030, abs=1e-3)


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
    assert j.culprit == 1 and j.step_s == pytest.approx(0.1025, abs=0.002)
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
        f"=> rank 1 holds the job back: compute, {ms(j.lost_s)} a step above the other ranks; the job's step, "
        f"{ms(j.step_s)}, would be {round(j.share * 100)} % shorter at their pace"
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
    assert cause.found and cause.why.startswith("more work: its main thread ran 68 ms a step on a CPU, the other")
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
    assert explain(j, {0: _ev(0)}).why.startswith(
        "cause not found: the kernel's figures of the rank were not read twice"
    )


# ----------------------------------------------------------------------------- the summary


def test_the_summary_gives_each_phase_for_the_slowest_rank_and_the_others_and_the_verdict() -> None:
    j = _compute_straggler()
    places = {r: RankPlace(r, r, 0, "h", str(r), 0) for r in range(2)}
    rows = [
        RankRow(places[r], 100 + r, 40, j.step_s, j.phases[r], peak_bytes=(300 + r) << 20, state="exited")
        for r in range(2)
    ]
    lines = summary_lines(j, None, rows, places=places, pace=9.8)
    assert lines[0] == "step report: 40 steps of 2 ranks, 9.8 steps/s, a step 103 ms"
    assert lines[1].split() == ["share", "of", "a", "step", "rank", "1", "(slowest)", "the", "others", "(median)"]
    assert set(lines[2].strip()) == {"─"}  # the header's rule
    compute = lines[4].split()
    assert compute[0] == "compute" and int(compute[1]) > 90 and int(compute[3]) < 50
    assert lines[7].split() == ["peak", "memory", "301", "MiB", "300", "MiB"]
    assert lines[8].startswith("=> rank 1 holds the job back: compute")
    multi = verdict_lines(j, None, {1: RankPlace(1, 1, 1, "nodeB", "")}, multi_node=True)
    assert multi[0].startswith("=> rank 1 (node 1, nodeB) holds the job back")


# ----------------------------------------------------------------------------- jobs of other shapes


def test_a_few_long_steps_are_too_few_to_name_a_rank() -> None:
    """Five steps of 10 s, rank 1 two seconds slower in each: four steps after the start, too few for the sign test
    (a lucky rank is behind in all four one time in sixteen); its figures are still there."""
    j = judge(_steps(2, 5, work=10.0, slow=1, extra=2.0))
    assert j.culprit is None and j.steps == 4 and j.slowest == 1 and j.step_s == pytest.approx(12.002, abs=0.01)
    assert verdict_lines(j, None, {}) == [
        "=> too few steps to judge which rank holds the job back (4 steps of every rank, fewer than 12)"
    ]


def test_ranks_that_stopped_at_different_steps_are_judged_on_the_steps_they_all_took() -> None:
    """Uneven data: rank 1 ran out after 30 steps, rank 0 took 40 (DDP's Join). Rank 1, slow while they ran
    together, is named on those steps; a balanced job of uneven ranks names none."""
    points = _steps(2, 40, slow=1, extra=0.030, phase="input", noise=0.2)
    points[1] = points[1][:30]
    j = judge(points)
    assert j.culprit == 1 and j.phase == "input" and j.steps == 29
    even = _steps(2, 40, noise=0.2, seed=3)
    even[1] = even[1][:30]
    assert judge(even).culprit is None


def test_a_rank_without_optimizer_steps_or_whose_steps_started_over_is_no_verdict() -> None:
    """A rank that never stepped an optimizer beside ranks that did, and a rank whose records started over (its
    process restarted alone: its step 5 is not the others' step 5), are said, and no rank is named."""
    points = _steps(3, 40, slow=1, extra=0.030)
    points[2] = points[2][:1]  # its first step only: it holds the rank's start
    j = judge(points)
    assert j.culprit is None and j.reason == "rank 2 took no optimizer step after its first"
    assert verdict_lines(j, None, {}) == [
        "=> no verdict on the job: rank 2 took no optimizer step after its first (the ranks are compared step by step)"
    ]
    apart = _steps(2, 40, slow=1, extra=0.030)
    apart[0] = [dataclasses.replace(p, step=p.step + 400) for p in apart[0]]
    j = judge(apart)
    assert j.culprit is None and j.reason == (
        "the ranks' steps do not line up (rank 0's 401-440, rank 1's 2-40): a rank's records started over"
    )
    assert (
        judge({0: points[0][:1], 1: points[1][:1]}).reason == "no step after each rank's first, which holds its start"
    )


def test_the_summary_of_a_job_of_one_step_is_its_head_line_and_why_nothing_is_judged() -> None:
    points = _steps(2, 1)
    j = judge(points)
    places = {r: RankPlace(r, r, 0, "h", str(r), 0) for r in range(2)}
    rows = [RankRow(places[r], 100 + r, 1, None, {}, state="exited") for r in range(2)]
    assert summary_lines(j, None, rows, places=places, pace=None) == [
        "step report: 1 step of 2 ranks",
        "=> too few steps to judge which rank holds the job back (no step after each rank's first, which holds its "
        "start)",
    ]
