"""The step report of numarun's agent: where each rank's step time goes, which rank holds the job back, and why
(docs/steps.md).

Each rank's recorder (:mod:`numarun.worker.phases`, installed by the bootstrap) writes one
:class:`~numarun.worker.steps.StepRecord` per optimizer step to ``steps.<local rank>.jsonl`` in numarun's private
directory. A thread of the agent (``numarun-steps``, one per job; :class:`StepWatch`), every
``NUMARUN_STEP_INTERVAL`` seconds (default 5):

* reads the new records of each local rank (:class:`~numarun.launch.steps.watch.Tail`), and samples the kernel's
  figures of each live rank (:mod:`~numarun.launch.steps.evidence`): they are gone once the rank is;
* in a multi-node job, publishes its node's view (each rank's row, its latest steps, its figures) in the rendezvous
  store; the node with group rank 0 reads every node's, judges (:mod:`~numarun.launch.steps.judge`), explains
  (:mod:`~numarun.launch.steps.cause`) and publishes the job's live table, which every other node reads back;
* writes that table (:class:`~numarun.worker.steps.LiveTable`) to ``steps.live.json`` in its private directory, on
  every node, with every rank of the job: what ``numarun top`` shows.

At the end of the job (:meth:`StepWatch.close`, before the private directory goes) each node writes its ranks'
records, the picture and the Chrome trace to ``numarun_steps.<host>.<pid>/`` in the run dir, the log dir or
``$TMPDIR`` (:func:`keep_dir`); the judging node prints the summary (:mod:`~numarun.launch.steps.report`).

A thread of its own, not the hang watchdog's: the report samples the kernel on a steady tick while the watchdog's
thread may wait a minute and more on a roll-call, and either may be off without the other. Store keys (multi-node,
under ``numarun/steps/<restart>/``): ``node/<n>`` each node's view and ``table`` the job's table, rewritten every
report: per node O(1) keys per report, the judge O(nodes).
"""

from .cause import Cause, explain
from .judge import Judgement, Point, judge
from .policy import DEFAULT_INTERVAL_S, StepPolicy, StepReport, interval_from, steps_from
from .watch import StepWatch, keep_dir

__all__ = [
    "DEFAULT_INTERVAL_S",
    "Cause",
    "Judgement",
    "Point",
    "StepPolicy",
    "StepReport",
    "StepWatch",
    "explain",
    "interval_from",
    "judge",
    "keep_dir",
    "steps_from",
]
