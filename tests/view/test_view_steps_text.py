"""The step report's words (numarun.view.steps_text): its figures, and the summary's head line and table, drawn by
tables.render (columns aligned by rich, the header ruled off) and read back as the e2e tests read a job's log."""

from __future__ import annotations

from numarun.view.steps_text import ShareColumn, ms, pct, peak_text, summary_text
from numarun.worker.steps import PHASES

SLOW = {"input": 0.0, "compute": 0.93, "comm": 0.06, "optim": 0.01}
OTHERS = {"input": 0.0, "compute": 0.16, "comm": 0.84, "optim": 0.0}


def test_ms_pct_and_peak_text() -> None:
    assert [ms(x) for x in (0.00042, 0.0123, 0.5, 1.25, 12.0)] == ["0.4 ms", "12 ms", "500 ms", "1.2 s", "12 s"]
    assert [pct(x) for x in (0.0, 0.064, 1.0)] == ["0 %", "6 %", "100 %"]
    assert [peak_text(v) for v in (None, 512, 3 * 2**20, int(1.25 * 2**30), 200 * 2**30)] == [
        "-",
        "512 B",
        "3.0 MiB",
        "1.2 GiB",
        "200 GiB",
    ]


def test_the_summary_is_a_head_line_and_a_table_with_a_row_per_phase_and_the_peak_memory() -> None:
    columns = [
        ShareColumn("rank 1 (slowest)", SLOW, 308 * 2**20),
        ShareColumn("the others (median)", OTHERS, None),
    ]
    lines = summary_text(steps=30, ranks=2, nodes=2, pace=2.84, step_s=0.395, columns=columns)
    assert lines[0] == "step report: 30 steps of 2 ranks on 2 nodes, 2.84 steps/s, a step 395 ms"
    assert lines[1] == "  share of a step   rank 1 (slowest)   the others (median)"
    assert lines[2] == "  " + "─" * (len(lines[1]) - 2)
    assert [line.split()[0] for line in lines[3:7]] == list(PHASES)
    compute = lines[3 + PHASES.index("compute")]
    assert compute.split() == ["compute", "93", "%", "16", "%"] and len(compute) == len(lines[1])  # right-aligned
    assert lines[7].split() == ["peak", "memory", "308", "MiB", "-"] and len(lines) == 8


def test_one_rank_without_memory_has_no_peak_row() -> None:
    lines = summary_text(steps=5, ranks=1, nodes=1, pace=None, step_s=12.0, columns=[ShareColumn("rank 0", SLOW)])
    assert lines[0] == "step report: 5 steps of 1 rank, a step 12 s"
    assert lines[1].split() == ["share", "of", "a", "step", "rank", "0"] and len(lines) == 3 + len(PHASES)


def test_uneven_counts_a_restart_and_a_single_step_are_said_in_the_head_line() -> None:
    columns = [ShareColumn("rank 0", SLOW)]
    uneven = summary_text(steps=30, ranks=2, nodes=1, pace=9.5, step_s=0.1, columns=columns, most=40, restart=1)
    assert uneven[0] == "step report: 30 to 40 steps of 2 ranks after restart 1, 9.5 steps/s, a step 100 ms"
    assert summary_text(steps=1, ranks=2, nodes=1, pace=None, step_s=None, columns=[]) == [
        "step report: 1 step of 2 ranks"
    ]
