"""What a node keeps of its ranks' steps at the end of a job, and the summary the judging node prints.

The summary is said whatever becomes of the files: a log dir that is full, read-only or gone keeps none of them (each
is written whole or not at all, and a set that could not be finished is taken back), which one line says, naming the
file and the error; a view that cannot be drawn is left out and said (:class:`~numarun.launch.notes.Notes`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...fsutil import write_atomic
from ...worker.steps import LiveTable, RankPlace, StepRecord
from ..notes import Notes, os_error
from .report import summary_lines
from .views import Verdict

PICTURE_STEPS = 2000
"""The picture and the trace show each rank's latest steps, at most this many."""


def keep_files(
    keep: Path,
    records: Mapping[int, Sequence[StepRecord]],
    places: Mapping[int, RankPlace],
    *,
    verdict: Verdict | None,
    table: LiveTable | None,
    nodes: int,
    pace: float | None,
    notes: Notes,
    restart: int = 0,
) -> list[str]:
    """Write this node's ranks' records, the picture and the trace to ``keep`` (and the summary, on the judging node:
    ``verdict`` given); the lines numarun says. ``pace``: the job's steps per second over its whole run."""
    from ...view.steps_picture import picture
    from ...view.steps_trace import chrome_trace

    shown = [rec for rank in sorted(records) for rec in records[rank][-PICTURE_STEPS:]]
    views: list[tuple[str, Callable[[], str]]] = [
        ("steps.jsonl", lambda: "".join(rec.line() for rank in sorted(records) for rec in records[rank])),
        ("steps.svg", lambda: picture(shown, places)),
        ("steps.trace.json", lambda: json.dumps(chrome_trace(shown, places))),
    ]
    made: list[tuple[str, str]] = []
    for name, make in views:
        try:
            made.append((name, make()))
        except Exception as e:  # a view that cannot be drawn is left out, the others are kept
            notes.failed(f"the step report's {name}", e)
    names = ", ".join(name for name, _ in made)
    files = f"{keep}/ ({names})"
    text: list[str] = []
    if verdict is not None and table is not None:
        text = summary_lines(
            verdict.judgement,
            verdict.cause,
            table.rows,
            places={row.place.rank: row.place for row in table.rows},
            pace=pace,
            nodes=table.nodes,
            restart=restart,
        )
        made.append(("summary.txt", "".join(f"{line}\n" for line in [*text, _files_line(files, nodes)])))
    trouble = _write_all(keep, made)
    if trouble:
        return [*text, trouble]
    return [*text, _files_line(files, nodes)] if text else [f"step report of this node's ranks: {files}"]


def _files_line(files: str, nodes: int) -> str:
    return f"the steps of every rank{' of this node' if nodes > 1 else ''}: {files}"


def _write_all(keep: Path, made: Sequence[tuple[str, str]]) -> str:
    """Every file of ``made`` in ``keep``, or none of them: '' when all were written, else the line that says which
    could not be and why."""
    done: list[Path] = []
    try:
        keep.mkdir(parents=True, exist_ok=True)
        for name, text in made:
            write_atomic(keep / name, text)
            done.append(keep / name)
    except OSError as e:
        failed = keep / made[len(done)][0] if len(done) < len(made) else keep
        for path in done:
            with contextlib.suppress(OSError):
                path.unlink()
        with contextlib.suppress(OSError):
            keep.rmdir()  # only if empty: it was made for these files
        return f"WARNING: the step report's files are not kept: cannot write {failed}: {os_error(e)}"
    return ""


def pace(first: StepRecord, last: StepRecord) -> float | None:
    """Steps per second of a rank from the start of ``first`` (its first step after its start: step 1 holds it) to
    the end of ``last``, counted by their numbers: the records between them may have been rotated away."""
    span = last.end - first.start
    return (last.step - first.step + 1) / span if last.step >= first.step and span > 0 else None
