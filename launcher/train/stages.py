"""Which pipeline stages a layout makes, which rank holds which, and the rules a schedule sets (pure but for the
one look-up of torch's schedule names).

The model is split by layers, the input layer (GPT: the embeddings) and the output layer (GPT: final norm and
head) each counted as one layer, as torchtitan counts them: an even split of ``n_layers + 2`` layers over
``pp x stages per rank`` stages, and where it does not divide evenly the extra layers go to the middle stages,
so that the first and the last stage are the lighter ones. ``parallel.pp_split`` gives the blocks of each stage
instead. Looped schedules put stage ``s`` on pipeline rank ``s % pp``; V schedules (ZBVZeroBubble, DualPipeV)
put stages ``r`` and ``2 pp - 1 - r`` on rank ``r``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import TRAINER_LAYOUT, LayoutError

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""The schedules the trainer can build, spelled as torch's ``get_schedule_class`` spells them (it matches any
case); the ones the installed torch lacks are left out (:func:`accepted_schedules`)."""
_SINGLE = frozenset({"GPipe", "1F1B"})
"""One stage per rank (``PipelineScheduleSingle``); the others hold several (``PipelineScheduleMulti``)."""
_V_STYLE = frozenset({"ZBVZeroBubble", "DualPipeV"})
_MB_AT_LEAST_STAGES = frozenset({"1F1B", "DualPipeV"})
"""Schedules that refuse fewer microbatches than stages."""
_MB_ROUNDS = frozenset({"Interleaved1F1B", "InterleavedZeroBubble"})
"""Schedules that run microbatches in rounds of ``max(1, n // pp)``: n must be a multiple of the rounds."""


@functools.cache
def accepted_schedules() -> tuple[str, ...]:
    """:data:`SCHEDULES` that the installed torch's ``get_schedule_class`` knows."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    found = []
    for name in SCHEDULES:
        try:
            get_schedule_class(name)
        except ValueError:
            continue
        found.append(name)
    return tuple(found)


def schedule_name(raw: str, *, installed: bool = True) -> str:
    """torch's spelling of ``raw`` (any case); one line listing the accepted names otherwise. ``installed=False``
    checks the spelling against :data:`SCHEDULES` alone, without importing torch's pipelining (which imports its
    compiler: a second of a launcher's start) for a job that runs no pipeline."""
    names = accepted_schedules() if installed else SCHEDULES
    match = {n.lower(): n for n in names}.get(str(raw).lower())
    if match is None:
        raise LayoutError(f"bad parallel.pp_schedule {raw!r}: expected one of {', '.join(names)}", where=TRAINER_LAYOUT)
    return match


@dataclass(frozen=True)
class PipelinePlan:
    """The stages of one pipeline and how a schedule runs them."""

    schedule: str
    """torch's name of the schedule class (:data:`SCHEDULES`)."""
    pp: int
    stages_per_rank: int
    microbatches: int
    split: tuple[int, ...]
    """Blocks (transformer or MLP blocks) of each stage, first stage first."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def looped(self) -> bool:
        """Several stages per rank (a ``PipelineScheduleMulti``)."""
        return self.schedule not in _SINGLE

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        """The stage indices pipeline rank ``pp_rank`` holds, in the order the schedule takes them."""
        if self.schedule in _V_STYLE:
            return (pp_rank, self.num_stages - 1 - pp_rank)
        return tuple(pp_rank + s * self.pp for s in range(self.stages_per_rank))

    def blocks_of(self, stage: int) -> range:
        first = sum(self.split[:stage])
        return range(first, first + self.split[stage])

    def describe(self) -> str:
        """``1F1B, 2 stages (in+0-1 | 2-3+out), 4 microbatches``: each stage's input layer, blocks, output layer."""
        parts = []
        for s in range(self.num_stages):
            b = self.blocks_of(s)
            held = ["in"] if s == 0 else []
            held += [f"{b.start}-{b.stop - 1}" if len(b) > 1 else str(b.start)] if len(b) else []
            held += ["out"] if s == self.num_stages - 1 else []
            parts.append("+".join(held))
        return f"{self.schedule}, {self.num_stages} stages ({' | '.join(parts)}), {self.microbatches} microbatches"


def even_split(n_layers: int, num_stages: int) -> tuple[int, ...]:
    """Blocks per stage for ``n_layers`` blocks and the input and output layers, over ``num_stages`` stages."""
    per, extra = divmod(n_layers + 2, num_stages)
    sizes = [per] * num_stages
    # the remainder to the middle stages first, then the first stage (its embedding is a cheap layer): the
    # last stage, which also computes the head and the loss, never gets one
    for s in [*range(1, num_stages - 1), 0][:extra]:
        sizes[s] += 1
    sizes[0] -= 1  # the input and output layers are not blocks
    sizes[-1] -= 1
    return tuple(sizes)


def plan_pipeline(
    parallel_cfg: Any, *, pp: int, n_layers: int, local_batch: int | None, layers_key: str = "model.n_layers"
) -> PipelinePlan:
    """The pipeline of a layout with ``pp`` > 1 pipeline ranks; one line naming the value and the rule it breaks.

    ``local_batch``: the samples one data-parallel rank takes per optimizer step and accumulation step (None:
    ``trainer.batch_size=auto``, which a pipeline cannot take: its stages are built for one microbatch shape).
    """
    name = schedule_name(parallel_cfg.pp_schedule)
    single = name in _SINGLE
    spr = parallel_cfg.pp_stages_per_rank
    if spr is None:
        spr = 1 if single else 2
    for broken, why in (
        (
            single and spr != 1,
            "a single-stage schedule holds 1 stage per rank; expected 1, or a looped schedule "
            f"({', '.join(n for n in accepted_schedules() if n not in _SINGLE)})",
        ),
        (
            not single and spr < 2,
            "a looped schedule holds several stages per rank; expected 2 or more (or parallel.pp_schedule=1F1B/GPipe)",
        ),
        (name in _V_STYLE and spr != 2, "a V schedule holds exactly 2 stages per rank; expected 2"),
    ):
        if broken:
            raise LayoutError(
                f"bad parallel.pp_stages_per_rank {spr} with parallel.pp_schedule={name}: {why}", where=TRAINER_LAYOUT
            )
    stages = pp * spr
    if parallel_cfg.pp_split is not None:
        split = tuple(int(n) for n in parallel_cfg.pp_split)
        if len(split) != stages or sum(split) != n_layers:
            raise LayoutError(
                f"bad parallel.pp_split {list(split)}: {len(split)} stages holding {sum(split)} blocks; expected "
                f"{stages} block counts (pp={pp} x {spr} stages per rank) adding up to {layers_key}={n_layers}",
                where=TRAINER_LAYOUT,
            )
        if any(n < 1 for n in split[1:-1]):
            raise LayoutError(
                f"bad parallel.pp_split {list(split)}: a middle stage holds no block; expected at least "
                "1 block in every stage but the first and the last (they hold the input and output layers)",
                where=TRAINER_LAYOUT,
            )
    else:
        if stages > n_layers + 2:
            raise LayoutError(
                f"bad layout: pp={pp} x {spr} stages per rank = {stages} pipeline stages for {layers_key}={n_layers} "
                f"({n_layers + 2} layers with the input and output layers); expected at most {n_layers + 2} stages",
                where=TRAINER_LAYOUT,
            )
        split = even_split(n_layers, stages)
    mb = parallel_cfg.pp_microbatches
    mb = stages if mb is None else int(mb)
    rounds = max(1, mb // pp)
    for broken, text in (  # in order: the first broken rule is named
        (
            name in _MB_AT_LEAST_STAGES and mb < stages,
            f"bad parallel.pp_microbatches {mb} with parallel.pp_schedule={name}: {stages} stages; "
            f"expected at least as many microbatches as stages ({stages})",
        ),
        (
            name in _MB_ROUNDS and mb % rounds,
            f"bad parallel.pp_microbatches {mb} with parallel.pp_schedule={name}: it runs {rounds} rounds "
            f"of max(1, microbatches // pp={pp}); expected a multiple of the rounds, e.g. "
            f"{pp * rounds} or {pp}",
        ),
        (
            local_batch is None,
            "bad trainer.batch_size 'auto' with parallel.pp > 1: pipeline stages are built for one "
            "microbatch shape; expected an integer trainer.batch_size",
        ),
        (
            local_batch is not None and local_batch % mb,
            f"bad parallel.pp_microbatches {mb}: a data-parallel rank's batch of {local_batch} samples "
            f"(trainer.batch_size / (dp_replicate x dp_shard x trainer.grad_accum)) is not divisible by "
            f"it; expected a divisor of {local_batch}",
        ),
    ):
        if broken:
            raise LayoutError(text, where=TRAINER_LAYOUT)
    return PipelinePlan(schedule=name, pp=pp, stages_per_rank=spr, microbatches=mb, split=split)
