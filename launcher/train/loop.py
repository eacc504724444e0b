"""The training loop: metrics, progress, checkpoint/resume, stop on SIGUSR1/SIGTERM, batch-size search.

Exit codes: 0 when the run finished or was stopped by SIGUSR1/SIGTERM after saving a
checkpoint (``summary.json`` says ``"stopped_by": "SIGUSR1"``; a requeued job resumes with
``trainer.resume=true``); 2 for a configuration mistake (one line on stderr).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import resource
import signal
import socket
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..config.schema import ModelKind, Precision, Schedule
from ..errors import ConfigError
from ..fsutil import write_atomic
from ..launch.signals import Requests
from ..worker import phases
from . import checkpoint
from .data import StepBatchSampler, build_dataset, build_loader
from .flops import flops_per_sample, mfu, peak_flops, phase_text
from .models import build_model, loss_fn
from .optim import build_optimizer
from .parallel import Parallelized, clip_grad_norm, parallelize
from .preflight import check_layout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Shared:
    """What every rank learns of all ranks after a step."""

    stop: int
    """The signal a rank received (0: none): every rank stops after this step."""
    peaks: list[float]
    watched: dict[str, list[Any]]
    bases: list[float] = field(default_factory=list)
    """Each rank's memory before its model was built (peak RSS of the imports and set-up on a CPU)."""


STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
"""SIGUSR1 (Slurm's warning before the time limit), SIGUSR2 and SIGTERM: finish the step, save, exit 0."""


def init_context() -> Any:
    """``numarun.init()``; a lone ``python scripts/train.py`` gets a one-rank environment first."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for k, v in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }.items():
            os.environ.setdefault(k, v)
    import numarun

    return numarun.init()


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this rank: max_memory_allocated on a GPU, peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def lr_at(step: int, optim_cfg: Any, total_steps: int) -> float:
    if optim_cfg.warmup_steps and step <= optim_cfg.warmup_steps:
        return optim_cfg.lr * step / optim_cfg.warmup_steps
    if optim_cfg.schedule == Schedule.COSINE:
        span = max(1, total_steps - optim_cfg.warmup_steps)
        frac = min(1.0, (step - optim_cfg.warmup_steps) / span)
        return optim_cfg.min_lr + 0.5 * (optim_cfg.lr - optim_cfg.min_lr) * (1 + math.cos(math.pi * frac))
    return optim_cfg.lr


class Trainer:
    def __init__(self, cfg: Any, run_dir: Path, ctx: Any, stops: Requests | None = None) -> None:
        """``stops``: the signals that ask the run to stop after its step (:data:`STOP_SIGNALS`), read after each
        step."""
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.stops = stops
        self.rank = ctx.rank
        t = cfg.trainer
        layout, pipeline_plan = check_layout(
            cfg, world_size=ctx.world_size, nnodes=ctx.num_nodes, nproc_per_node=ctx.local_world_size
        )
        self.base_mem = peak_memory_mb(ctx.device)
        torch.manual_seed(t.seed)  # identical initial weights on every rank and every layout
        model = build_model(cfg.model)
        self.par: Parallelized = parallelize(model, ctx, cfg, layout, pipeline_plan)
        del model
        if t.compile:
            # each rank is bound to a few cores: inductor's pool of compile processes would
            # oversubscribe them (and was seen to hang in a sandboxed VM); compile in-process
            os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
            for part in self.par.parts:
                part.compile()
        # one optimizer per part (a pipeline rank may hold several stages), as torchtitan keeps them
        self.optimizers = [build_optimizer(part, cfg.optim, tp=layout.size("tp")) for part in self.par.parts]
        self.dataset = build_dataset(cfg.data, cfg.model, seed=t.seed)
        self.ckpt_dir = Path(t.checkpoint_dir) if t.checkpoint_dir else run_dir / "checkpoints"
        self.autocast = (
            torch.autocast(ctx.device.type, dtype=torch.bfloat16) if t.precision == Precision.BF16 else nullcontext()
        )
        self.tokens_per_sample = cfg.model.seq_len if cfg.model.kind == ModelKind.GPT else 0
        self.flops_per_sample = flops_per_sample(cfg.model)
        self.peak_flops = (
            peak_flops(torch.cuda.get_device_name(ctx.device), t.precision) if ctx.device.type == "cuda" else None
        )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def _zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)

    # -- one optimisation step -------------------------------------------------------------
    def _step(
        self, step: int, micro_batches: list[tuple[torch.Tensor, torch.Tensor]], lr: float
    ) -> tuple[float, float]:
        """One optimizer step; returns (the step's mean loss, the gradient norm before clipping), the same on every
        rank."""
        t = self.cfg.trainer
        torch.manual_seed(t.seed + 7919 * step + self.rank)  # dropout depends on the step, not on history
        for group in self.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.ctx.device)
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            loss = self.par.forward_backward(
                x.to(self.ctx.device), y.to(self.ctx.device), scale=1.0 / n, sync=i == n - 1, autocast=self.autocast
            )
            if loss is not None:
                total += loss
        # the last stage's loss, to every rank, while the gradients are clipped and applied
        mean_loss = dist.all_reduce(total, async_op=True)
        norm = clip_grad_norm(self.par, float(self.cfg.optim.grad_clip))
        for opt in self.optimizers:
            opt.step()
        self._zero_grad()
        mean_loss.wait()
        return float(total) / self.par.loss_ranks, norm

    def _batches(self, loader: Any) -> Any:
        it, n = iter(loader), self.cfg.trainer.grad_accum
        while len(micro := list(itertools.islice(it, n))) == n:
            yield micro

    # -- batch size search -------------------------------------------------------------------
    def find_batch_size(self) -> int:
        """trainer.batch_size=auto: double the global batch until it no longer fits; keep the last that did.

        Fits = no CUDA OOM (GPU), or peak RSS below trainer.memory_limit_mb (CPU). Every size's
        throughput goes to ``batch_size_search.json``. Steps taken here do not update weights.
        """
        t = self.cfg.trainer
        dp, accum = self.par.dp_size, t.grad_accum
        model = self.par.parts[0]  # no pipeline here (check_layout refuses batch_size=auto with one)
        limit = t.memory_limit_mb
        if limit is None and self.ctx.device.type == "cpu":
            import psutil

            limit = (
                (psutil.Process().memory_info().rss + psutil.virtual_memory().available / self.ctx.local_world_size)
                * 0.8
                / 2**20
            )
        results: list[dict[str, Any]] = []
        best = 0
        size = dp * accum
        while size <= t.auto_max_batch:
            sampler = StepBatchSampler(
                start_step=0, steps=2, global_batch=size, dp_rank=self.par.dp_rank, dp_size=dp, grad_accum=accum
            )
            fits, rate = True, 0.0
            try:
                start = time.perf_counter()
                for micro in self._batches(build_loader(self.dataset, sampler, num_workers=0)):
                    for x, y in micro:
                        with self.autocast:
                            loss = loss_fn(model(x.to(self.ctx.device)), y.to(self.ctx.device))
                        loss.backward()
                self._zero_grad()
                rate = 2 * size / max(time.perf_counter() - start, 1e-9)
            except torch.cuda.OutOfMemoryError:
                fits = False
                self._zero_grad()
                torch.cuda.empty_cache()
            peak = peak_memory_mb(self.ctx.device)
            flag = torch.tensor([int(fits and (limit is None or peak <= limit))], device=self.ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # a size fits only if it fits on every rank
            fits = bool(flag.item())
            results.append(
                {"batch_size": size, "fits": fits, "samples_per_s": round(rate, 2), "peak_mem_mb": round(peak, 1)}
            )
            if self.rank == 0:
                print(
                    f"batch size {size}: {'fits' if fits else 'does not fit'}, {rate:.1f} samples/s, peak {peak:.0f} "
                    "MiB",
                    flush=True,
                )
            if not fits:
                break
            best = size
            size *= 2
        capped = bool(results) and results[-1]["fits"]  # every size tried fitted: the cap stopped it
        if self.rank == 0:
            if capped:
                print(
                    f"batch size search stopped at trainer.auto_max_batch={t.auto_max_batch}: chose {best}, "
                    "larger sizes may fit (raise trainer.auto_max_batch to try them)",
                    flush=True,
                )
            write_atomic(
                self.run_dir / "batch_size_search.json",
                json.dumps(
                    {
                        "memory_limit_mb": limit,
                        "chosen": best,
                        "auto_max_batch": t.auto_max_batch,
                        "stopped_by": "auto_max_batch" if capped else "memory",
                        "sizes": results,
                    },
                    indent=1,
                )
                + "\n",
            )
        if best == 0:
            raise ConfigError(
                f"bad trainer.batch_size 'auto': even {dp * accum} samples exceed the memory limit "
                f"{limit:.0f} MiB; expected a larger trainer.memory_limit_mb or a smaller model"
            )
        return best

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> int:
        t = self.cfg.trainer
        start_step = 0
        resumed_from = None
        if self.rank == 0:
            checkpoint.remove_stale(self.ckpt_dir)  # a save killed or failed in an earlier run
        if t.resume:
            checkpoint.check_trusted(self.ckpt_dir)  # before torch unpickles anything from it
            report = (lambda line: print(line, flush=True)) if self.rank == 0 else None
            # every file's content checked, the ranks sharing the reading, before torch reads any
            found = checkpoint.newest_verified(
                self.ckpt_dir, rank=self.rank, world_size=self.ctx.world_size, report=report, device=self.ctx.device
            )
            if found is not None:
                meta = json.loads((found[1] / "meta.json").read_text())
                checkpoint.check_model(meta, self.cfg.model, found[1])
                start_step = checkpoint.load(found[1], self.par.parts, self.optimizers)
                resumed_from = str(found[1])
                if self.rank == 0:
                    saved = meta.get("layout")
                    moved = (
                        f"; saved with layout {saved}, resharded onto {self.par.layout.text}"
                        if (saved and saved != self.par.layout.text)
                        else ""
                    )
                    print(f"resumed from {found[1]} (step {start_step}){moved}", flush=True)
        batch_size = self.find_batch_size() if t.batch_size == "auto" else int(t.batch_size)
        sampler = StepBatchSampler(
            start_step=start_step,
            steps=t.steps,
            global_batch=batch_size,
            dp_rank=self.par.dp_rank,
            dp_size=self.par.dp_size,
            grad_accum=t.grad_accum,
        )
        loader = build_loader(self.dataset, sampler, num_workers=self.cfg.data.num_workers)
        metrics = (self.run_dir / "metrics.jsonl").open("a") if self.rank == 0 else None
        progress = self._progress(t.steps, start_step)
        losses: list[float] = []
        rates: list[float] = []
        stopped_by = None
        step = start_step
        last_saved = start_step if resumed_from else -1
        t_run = time.perf_counter()
        try:
            for step, micro in enumerate(self._batches(loader), start=start_step + 1):
                t0 = time.perf_counter()
                loss, norm = self._step(step, micro, lr_at(step, self.cfg.optim, t.steps))
                dt = time.perf_counter() - t0
                losses.append(loss)
                rates.append(batch_size / dt)
                shared = self._exchange()  # one collective a step: every rank's stop signal and figures
                if step % t.log_interval == 0 or step == t.steps or shared.stop:
                    self._log(metrics, progress, step, loss, batch_size, dt, shared, grad_norm=norm)
                if shared.stop:
                    stopped_by = signal.Signals(shared.stop).name  # all ranks stop after the same step
                    break
                if t.checkpoint_interval and step % t.checkpoint_interval == 0 and step != t.steps:
                    self._save(step)
                    last_saved = step
        finally:
            if progress is not None:
                progress.stop()
            if metrics is not None:
                metrics.close()
        if step != last_saved and step > start_step:
            self._save(step)
        shared = self._exchange()
        if self.rank == 0:
            summary = {
                "steps_done": step,
                "start_step": start_step,
                "final_loss": losses[-1] if losses else None,
                "first_loss": losses[0] if losses else None,
                "batch_size": batch_size,
                "world_size": self.ctx.world_size,
                "num_nodes": self.ctx.num_nodes,
                "parallel": self.cfg.parallel.kind,
                "layout": self.par.layout.text,
                "pipeline": self.par.pipeline.plan.describe() if self.par.pipeline is not None else None,
                "model": self.cfg.model.kind,
                "samples_per_s_mean": sum(rates) / len(rates) if rates else None,
                "tokens_per_s_mean": (sum(rates) / len(rates) * self.tokens_per_sample)
                if rates and self.tokens_per_sample
                else None,
                "peak_mem_mb_per_rank": shared.peaks,
                "base_mem_mb_per_rank": shared.bases,
                "wall_s": time.perf_counter() - t_run,
                "stopped_by": stopped_by,
                "resumed_from": resumed_from,
                "checkpoint": str(checkpoint.step_dir(self.ckpt_dir, step)) if step > start_step else None,
                **shared.watched,
            }
            write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
            print(f"done: {step} steps, final loss {summary['final_loss']}, run dir {self.run_dir}", flush=True)
        return 0

    def _save(self, step: int) -> None:
        meta = {
            "world_size": self.ctx.world_size,
            "parallel": self.cfg.parallel.kind,
            "layout": self.par.layout.text,
            "model": checkpoint.model_config(self.cfg.model),
        }
        checkpoint.save(self.ckpt_dir, step, self.par.parts, self.optimizers, meta=meta, rank=self.rank)

    def _exchange(self) -> _Shared:
        """All ranks' stop signal, peak memory and binding-watcher figures, in one all-gather."""
        from ..worker import binding_watch

        figures = binding_watch.figures()
        share = figures.get("remote_memory_share")
        stop = self.stops.first() if self.stops is not None else 0
        mine = torch.tensor(
            [
                float(stop),
                peak_memory_mb(self.ctx.device),
                -1.0 if share is None else float(share),
                float(figures.get("threads_repaired", 0)),
                1.0 if figures else 0.0,
                self.base_mem,
            ],
            dtype=torch.float64,
            device=self.ctx.device,
        )
        out = [torch.zeros_like(mine) for _ in range(self.ctx.world_size)]
        dist.all_gather(out, mine)
        rows = torch.stack(out).tolist()  # one copy to the host (one sync on a GPU), not one per rank
        watched: dict[str, list[Any]] = (
            {
                "remote_memory_share": [None if r[2] < 0 else round(r[2], 4) for r in rows],
                "threads_repaired": [int(r[3]) for r in rows],
            }
            if all(r[4] for r in rows)
            else {}  # the watcher is off
        )
        return _Shared(
            stop=int(max(r[0] for r in rows)),
            peaks=[round(r[1], 1) for r in rows],
            watched=watched,
            bases=[round(r[5], 1) for r in rows],
        )

    def _progress(self, total: int, done: int) -> Any:
        if self.rank != 0 or not self.cfg.trainer.progress or not sys.stderr.isatty():
            return None
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        progress.start()
        self._task = progress.add_task("train", total=total, completed=done, info="")
        return progress

    def _log(
        self,
        metrics: Any,
        progress: Any,
        step: int,
        loss: float,
        batch_size: int,
        dt: float,
        shared: _Shared,
        *,
        grad_norm: float,
    ) -> None:
        peaks = shared.peaks
        if self.rank != 0:
            return
        row: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": self.param_groups[0]["lr"],
            "samples_per_s": batch_size / dt,
            "step_time_s": dt,
            "peak_mem_mb": peaks,
            **shared.watched,
        }
        if self.tokens_per_sample:
            row["tokens_per_s"] = batch_size * self.tokens_per_sample / dt
        shares = phases.shares(self.cfg.trainer.log_interval)  # this rank's steps since the last line
        if shares:
            row["phases"] = {p: round(v, 4) for p, v in shares.items()}
        used = mfu(
            flops_per_step=self.flops_per_sample * batch_size if self.flops_per_sample else None,
            step_s=dt,
            ranks=self.ctx.world_size,
            peak=self.peak_flops,
        )
        if used is not None:
            row["mfu"] = round(used, 4)
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()
        rate = f"{row['tokens_per_s']:.0f} tok/s" if self.tokens_per_sample else f"{row['samples_per_s']:.0f} samples/s"
        text = f"loss {loss:.4f}  {rate}  peak {max(peaks):.0f} MiB"
        if shares:
            text += f"  {phase_text(shares)}"
        if used is not None:
            text += f"  MFU {used * 100:.1f} %"
        if progress is not None:
            progress.update(self._task, completed=step, info=text)
        else:
            print(f"step {step}/{self.cfg.trainer.steps}  {text}", flush=True)
