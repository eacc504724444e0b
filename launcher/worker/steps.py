"""The step report's records: what each rank writes per optimizer step, and what the agent shows of a running job.

A *step* of a rank is the time between two of its optimizer steps (the first from when the rank started counting).
Within it, four phases, in the order the picture stacks them: ``input`` (waiting on a DataLoader's iterator),
``compute`` (the rest), ``comm`` (inside torch.distributed's collectives, called from Python) and ``optim`` (the
optimizer's step). The rank writes one :class:`StepRecord` a step, a JSON line in ``steps.<local rank>.jsonl`` of
numarun's private directory (:data:`RECORDS`); the agent reads them, compares ranks across the job and keeps the
latest view of the job in ``steps.live.json`` (:data:`LIVE`, :class:`LiveTable`), which ``numarun top`` shows.

Pure: no torch import, no I/O but the two small helpers at the end. Times are ``time.monotonic()`` seconds, which
one host's processes share and other hosts do not: compare ``start``/``end`` only between ranks of one node.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import SchemaError
from ..jsonable import from_jsonable, loads, to_jsonable

FORMAT = 1
"""Of the records and the live table; bumped when a field changes meaning."""
PHASES = ("input", "compute", "comm", "optim")
"""A step's phases, in the order the picture and the tables show them."""
RECORDS = "steps.{local_rank}.jsonl"
"""A rank's records, in numarun's private directory (``NUMARUN_STATE_DIR``)."""
END = "steps.{local_rank}.end"
"""The file a rank writes at its exit once its last record is out; the agent removes it after its last look at the
rank (the kernel's figures of a process are gone once it has exited)."""
LIVE = "steps.live.json"
"""The agent's latest view of the whole job, in its private directory; rewritten at every report."""


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of one rank."""

    rank: int
    step: int
    """The optimizer steps this rank had taken when the step ended (1 for the first)."""
    start: float
    """``time.monotonic()`` when the step began: the previous optimizer step's end, or when counting began."""
    end: float
    """``time.monotonic()`` when this step's optimizer step returned."""
    input_s: float = 0.0
    comm_s: float = 0.0
    optim_s: float = 0.0
    compute_s: float = 0.0
    """The rest of the step: ``end - start`` less the other three (never below 0)."""
    peak_bytes: int | None = None
    """The rank's peak memory so far: the GPU's allocator where there is one, else the process's resident high-water
    mark; None when unknown."""
    gpu_s: float | None = None
    """GPU time of the step from CUDA events (read later, never synchronising); None without a GPU."""
    extra: dict[str, float] = field(default_factory=dict)
    """Further figures a recorder found (e.g. DDP's own sampled backward compute and communication times)."""

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    def phase_s(self, phase: str) -> float:
        """The seconds of one of :data:`PHASES`."""
        return float(getattr(self, f"{phase}_s"))

    def line(self) -> str:
        """The record as one JSON line (with its newline)."""
        return json.dumps({"v": FORMAT, **to_jsonable(self)}, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, line: str) -> StepRecord:
        """Inverse of :meth:`line`; ValueError (a :class:`~numarun.jsonable.SchemaError` or JSON's) when it is not
        one."""
        data = loads(line)
        if not isinstance(data, dict) or data.get("v") != FORMAT:
            raise SchemaError(f"$: not a step record of format {FORMAT}")
        return from_jsonable(cls, data)


def read_records(lines: Iterable[str]) -> Iterator[StepRecord]:
    """The records of ``lines``, skipping any that does not parse (a line a killed rank left half-written)."""
    for line in lines:
        with contextlib.suppress(ValueError):  # a blank line too
            yield StepRecord.parse(line)


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs, as numarun placed it: what the picture and ``numarun top`` label a rank with."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    cpus: str
    """Its cores as a cpu list (``"0-3,64-67"``); ``""`` when numarun did not bind it."""
    numa: int = -1
    """The NUMA node it was placed on; -1 spread or unknown."""
    nic: str | None = None
    gpu: str | None = None
    """Its GPU as the plan names it (index, or UUID), None without one."""

    def label(self) -> str:
        """``rank 3  node 0  cpus 8-11  numa 1  nic mlx5_1  gpu 3`` (what is unknown is left out)."""
        parts = [f"rank {self.rank}", f"node {self.node_rank}"]
        parts += [f"cpus {self.cpus}"] if self.cpus else ["cpus unbound"]
        parts += [f"numa {self.numa}"] if self.numa >= 0 else []
        parts += [f"nic {self.nic}"] if self.nic else []
        parts += [f"gpu {self.gpu}"] if self.gpu is not None else []
        return "  ".join(parts)


@dataclass(frozen=True)
class RankRow:
    """One rank in the live view: its place and its recent pace."""

    place: RankPlace
    pid: int
    steps: int
    """Optimizer steps taken so far."""
    step_s: float | None
    """The median step time over the recent window; None before two steps."""
    phases: dict[str, float] = field(default_factory=dict)
    """Median seconds per step of each of :data:`PHASES` over the recent window."""
    peak_bytes: int | None = None
    state: str = "running"
    """``running``, ``exited`` (with its code in the verdict's text), ``stopped``."""


@dataclass(frozen=True)
class LiveTable:
    """The agent's latest view of the job (:data:`LIVE`)."""

    updated: float
    """``time.time()`` of the report."""
    rows: tuple[RankRow, ...]
    steps_per_s: float | None = None
    """The job's pace: optimizer steps per second of its slowest rank over the recent window."""
    verdict: str | None = None
    """The latest verdict line, ``=> rank 3 holds the job back: ...`` or ``=> no rank holds the job back``."""
    nodes: int = 1
    """How many nodes' ranks ``rows`` holds, of the job's."""
    job_nodes: int = 1
    slowest: int | None = None
    """The rank whose own time (its step less its waiting in collectives) is longest over the window, named by the
    verdict or not; None before the ranks can be compared."""

    def text(self) -> str:
        return json.dumps({"v": FORMAT, **to_jsonable(self)}, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> LiveTable:
        data = loads(text)
        if not isinstance(data, Mapping) or data.get("v") != FORMAT:
            raise SchemaError(f"$: not a live table of format {FORMAT}")
        return from_jsonable(cls, dict(data))
