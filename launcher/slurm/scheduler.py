"""The scheduler seam: what ``numarun submit`` needs from a batch system, and Slurm's implementation.

``numarun submit`` builds a :class:`~numarun.slurm.script.SlurmJob` and talks to a
:class:`BatchScheduler` only: render it (what ``--dry-run`` prints), submit it, follow it, cancel it.
What runs on each node is engine-neutral (``numarun slurm-node task`` reads the node list, node
rank and head address from the engine's variables; see :mod:`numarun.slurm.node`), so a second
engine (a Kubernetes JobSet or PyTorchJob) is one more class with these four methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .script import SlurmJob, render_sbatch
from .submit import JobRecord, cancel, sbatch, wait_for_job


class BatchScheduler(Protocol):
    name: str

    def render(self, job: SlurmJob) -> str:
        """The submission text (batch script, manifest): what --dry-run prints."""

    def submit(self, text: str) -> str:
        """Submit the rendered text; return the job id."""

    def status(self, job_id: str, *, poll_seconds: float, on_state: Callable[[str], None] | None) -> list[JobRecord]:
        """Follow the job to its end; its final records."""

    def cancel(self, job_id: str) -> None:
        """Stop the job."""


class SlurmScheduler:
    name = "slurm"

    def render(self, job: SlurmJob) -> str:
        return render_sbatch(job)

    def submit(self, text: str) -> str:
        return sbatch(text)

    def status(
        self, job_id: str, *, poll_seconds: float = 2.0, on_state: Callable[[str], None] | None = None
    ) -> list[JobRecord]:
        return wait_for_job(job_id, poll_seconds=poll_seconds, on_state=on_state)

    def cancel(self, job_id: str) -> None:
        cancel(job_id)
