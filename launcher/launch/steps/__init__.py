"""The step report, a use of numarun's node agent (:mod:`numarun.launch.agent`): where each rank's step time goes,
which rank holds the job back, and why (docs/steps.md).

Each rank's recorder (:mod:`numarun.worker.phases`, installed by the bootstrap) writes one
:class:`~numarun.worker.steps.StepRecord` per optimizer step to ``steps.<local rank>.jsonl`` in numarun's private
directory. The agent's thread (:class:`StepWatch`), every ``NUMARUN_STEP_INTERVAL`` seconds (default 5), at the
ranks' first records and at each rank's exit:

* reads the new records of each local rank (:mod:`.tail`), and samples the kernel's figures of each live rank
  (:mod:`.evidence`): they are gone once the rank is;
* in a multi-node job, publishes its node's view (:mod:`.views`: each rank's row, its latest steps, its figures) in
  the job's store (:mod:`.exchange`); the node with group rank 0 reads every node's, judges (:mod:`.judge`), explains
  (:mod:`.cause`) and publishes the job's live table, which every other node reads back;
* writes that table (:class:`~numarun.worker.steps.LiveTable`) to ``steps.live.json`` in its private directory, on
  every node, with every rank of the job: what ``numarun top`` shows.

At the end of a job each node hands its last view to the judge (before torchrun's exit barrier), writes its ranks'
records, the picture and the Chrome trace to ``numarun_steps.<host>.<pid>/`` in the run dir, the log dir or
``$TMPDIR`` (:mod:`.files`); the judging node prints the summary (:mod:`.report`).
"""

from .policy import DEFAULT_INTERVAL_S, StepPolicy, StepReport, interval_from, steps_from
from .watch import StepWatch

__all__ = [
    "DEFAULT_INTERVAL_S",
    "StepPolicy",
    "StepReport",
    "StepWatch",
    "interval_from",
    "steps_from",
]
