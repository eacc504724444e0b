"""Talk to Slurm: ``sbatch --parsable``, then follow a job with ``squeue``, ``scontrol`` and ``sacct``.

The only submit-side module that runs Slurm commands, each bounded by COMMAND_TIMEOUT_S (named in
the error). A finished job's state and exit code come from ``scontrol show job``, which keeps
the record for ``MinJobAge`` seconds (300 by default) after the job ends, then from ``sacct``
where the site has accounting, else the last state seen in the queue, said to be that.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..envvars import SLURM_TIMEOUT
from ..errors import SlurmError, expected

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class JobRecord:
    """One job (or array task) as ``scontrol show job`` reports it."""

    job_id: str
    state: str
    """JobState, e.g. COMPLETED, FAILED, CANCELLED, TIMEOUT, PENDING."""
    exit_code: int
    signal: int
    restarts: int = 0

    @property
    def return_code(self) -> int:
        """What ``numarun submit --wait`` exits with for this job."""
        if self.exit_code:
            return self.exit_code
        if self.signal:
            return 128 + self.signal
        return 0 if self.state == "COMPLETED" else 1


COMMAND_TIMEOUT_S = 60.0
"""Bound on every Slurm client call: a slurmctld that never answers must not hang submit."""


def command_timeout() -> float:
    """COMMAND_TIMEOUT_S, or the seconds in $NUMARUN_SLURM_TIMEOUT (a slow controller)."""
    raw = os.environ.get(SLURM_TIMEOUT, "")
    try:
        value = float(raw) if raw else COMMAND_TIMEOUT_S
    except ValueError:
        raise SlurmError(expected(raw, "seconds, e.g. 60", SLURM_TIMEOUT)) from None
    if not value > 0:
        raise SlurmError(expected(raw, "seconds > 0", SLURM_TIMEOUT))
    return value


def _run(
    argv: Sequence[str], *, input_text: str | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    limit = command_timeout() if timeout is None else timeout
    try:
        return subprocess.run(list(argv), input=input_text, capture_output=True, text=True, check=False, timeout=limit)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"'{' '.join(argv[:3])}' did not answer within {limit:g} s: expected a reachable slurmctld "
            f"(or a longer {SLURM_TIMEOUT})"
        ) from None
    except FileNotFoundError:
        raise SlurmError(
            f"bad Slurm client {argv[0]!r}: expected '{argv[0]}' on PATH (is this a Slurm login node?)"
        ) from None


def parse_gres_gpus(text: str) -> int:
    """``sinfo -h -o %G`` lines (``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)``) -> the fewest GPUs of a node."""
    counts = []
    for line in text.split():
        n = 0
        for item in re.split(r",(?![^(]*\))", line):
            m = re.fullmatch(r"gpu(?::[^:(]+)?:(\d+)(?:\(.*\))?", item)
            if m:
                n += int(m.group(1))
        counts.append(n)
    return min(counts) if counts else 0


def partition_gpus(partition: str | None) -> int:
    """GPUs per node of the partition (the fewest of its nodes; without one: the default
    partition, which sinfo marks with '*'); 0 when sinfo cannot say."""
    try:
        proc = _run(["sinfo", "-h", "-o", "%P|%G"])
    except SlurmError as e:
        log.info("no GPU count for the partition: %s", e)
        return 0
    if proc.returncode != 0:
        log.info("no GPU count for the partition: sinfo: %s", " ".join(proc.stderr.split()))
        return 0
    rows = (line.strip().partition("|") for line in proc.stdout.splitlines())  # name|gres
    return parse_gres_gpus(
        "\n".join(
            gres
            for name, _, gres in rows
            if (name.endswith("*") if partition is None else name.rstrip("*") in partition.split(","))
        )
    )


def sbatch(script_text: str, *, sbatch_cmd: str = "sbatch") -> str:
    """Submit the script on stdin; return the job id (``--parsable`` prints ``ID[;cluster]``)."""
    proc = _run([sbatch_cmd, "--parsable"], input_text=script_text)
    if proc.returncode != 0:
        msg = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise SlurmError(f"sbatch refused the job: {msg}")
    job_id = proc.stdout.strip().split(";", 1)[0]
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError(
            f"bad sbatch output {proc.stdout.strip()!r}: expected a job id such as '1234' or '1234;cluster'"
        )
    return job_id


def parse_scontrol_jobs(text: str) -> list[JobRecord]:
    """``scontrol show job`` output (one record per job or array task) -> records."""
    records = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields = dict(re.findall(r"(\w+)=(\S*)", block))
        if "JobId" not in fields:
            continue
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        job_id = fields["JobId"]
        if fields.get("ArrayJobId") and fields.get("ArrayTaskId", "").isdigit():
            job_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
        records.append(
            JobRecord(
                job_id=job_id,
                state=fields.get("JobState", "UNKNOWN"),
                exit_code=int(code) if code.isdigit() else 1,
                signal=int(sig) if sig.isdigit() else 0,
                restarts=int(fields.get("Restarts", "0")) if fields.get("Restarts", "0").isdigit() else 0,
            )
        )
    return records


def queued_states(job_id: str) -> list[str] | None:
    """States of the job's entries still in the queue; None if squeue failed."""
    proc = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if proc.returncode != 0:  # squeue fails for an id the controller has already forgotten: treat as gone
        return [] if "Invalid job id" in proc.stderr else None
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def parse_sacct(text: str) -> list[JobRecord]:
    """``sacct -n -P -o JobID,State,ExitCode`` lines -> one record per job or array task (steps dropped)."""
    records = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or "." in parts[0] or not parts[0]:
            continue
        code, _, sig = parts[2].partition(":")
        # 'CANCELLED by 0' -> CANCELLED
        records.append(
            JobRecord(
                job_id=parts[0],
                state=parts[1].split()[0] if parts[1] else "UNKNOWN",
                exit_code=int(code) if code.isdigit() else 1,
                signal=int(sig) if sig.isdigit() else 0,
            )
        )
    return records


def job_records(job_id: str, *, last_state: str = "") -> list[JobRecord]:
    """The job's final records: ``scontrol show job``, else ``sacct``, else its last known state.

    slurmctld forgets a finished job after ``MinJobAge`` (300 s by default); accounting, where a
    site has it, keeps it. Without either, the last state seen in the queue is all there is.
    """
    proc = _run(["scontrol", "show", "job", job_id])
    records = parse_scontrol_jobs(proc.stdout) if proc.returncode == 0 else []
    if records:
        return records
    why_scontrol = " ".join(proc.stderr.split()) or "no record"
    try:
        acct = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode"])
    except SlurmError as e:
        why_sacct = str(e)
    else:
        records = parse_sacct(acct.stdout) if acct.returncode == 0 else []
        if records:
            return records
        why_sacct = " ".join(acct.stderr.split()) or "no record (is accounting enabled?)"
    state = last_state or "UNKNOWN"
    log.warning(
        "job %s: final state unknown: slurmctld forgot it (scontrol: %s; see MinJobAge) and sacct has no record (%s); "
        "last seen %s",
        job_id,
        why_scontrol,
        why_sacct,
        state,
    )
    return [JobRecord(job_id=job_id, state=f"{state} (last seen; final state unknown)", exit_code=1, signal=0)]


def wait_for_job(
    job_id: str,
    *,
    poll_seconds: float = 2.0,
    on_state: Callable[[str], None] | None = None,
    max_squeue_failures: int = 30,
) -> list[JobRecord]:
    """Block until the job (all array tasks) has left the queue; return its final records."""
    last = ""
    failures = 0
    while True:
        try:
            states = queued_states(job_id)
        except SlurmError as e:  # squeue timed out: as a failure to answer
            log.info("%s", e)
            states = None
        if states is None:
            failures += 1
            if failures > max_squeue_failures:
                raise SlurmError(f"squeue kept failing for job {job_id!r}: expected a reachable slurmctld")
        else:
            failures = 0
            if not states:
                break
            summary = ",".join(sorted(set(states)))
            if summary != last and on_state is not None:
                on_state(summary)
            last = summary
        time.sleep(poll_seconds)
    return job_records(job_id, last_state=last)


def overall_return_code(records: Sequence[JobRecord]) -> int:
    """0 when every task completed, else the first failing task's code."""
    return next((r.return_code for r in records if r.return_code), 0)
