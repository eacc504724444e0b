#!/usr/bin/env python3
"""Peak memory per rank of pipeline stages (pp=2) against DDP, for a model whose weights and optimizer state
dominate: the same trainer job, the same global batch, on the same ranks, run side by side in one invocation.

    .venv/bin/python scripts/bench_pp_memory.py [--d-model 512] [--layers 8] [--rounds 1] [--nproc 2]

Each round runs ``numarun scripts/train.py`` twice (the order flips every round): ``parallel=ddp`` (every rank
holds the whole model, its gradients and AdamW's two moments) and ``parallel=fsdp parallel.pp=<nproc>`` (each
rank holds one stage of the GPT's blocks, the embedding and the head counted as layers). It prints each rank's
peak (CUDA max_memory_allocated on a GPU; peak RSS on a CPU, which includes Python and torch themselves), the
peak above what the rank held before building its model (the training state's own share on a CPU), and the
ratios pp / DDP of the largest rank of each; the last line is ``PP_MEMORY peak=<ratio> above_start=<ratio>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _numarun() -> list[str]:
    exe = Path(sys.executable).parent / "numarun"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "numarun"]


def _run(layout: list[str], *, args: argparse.Namespace, run_dir: Path) -> dict:
    job = [
        "model=gpt",
        f"model.d_model={args.d_model}",
        f"model.n_layers={args.layers}",
        "model.n_heads=8",
        "optim=adamw",
        f"trainer.batch_size={args.batch_size}",
        f"trainer.steps={args.steps}",
        "trainer.checkpoint_interval=0",
        f"trainer.checkpoint_dir={run_dir / 'ck'}",
        "trainer.progress=false",
    ]
    cmd = [
        *_numarun(),
        "--nproc-per-node",
        str(args.nproc),
        "--binding",
        args.binding,
        str(REPO / "scripts" / "train.py"),
        *job,
        *layout,
        f"hydra.run.dir={run_dir}",
    ]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit(f"bench_pp_memory: {' '.join(cmd)} failed with code {r.returncode}:\n{r.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    # the last step's figures: the summary's peaks would count the final checkpoint save too
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return {**summary, "peak_mem_mb_per_rank": last["peak_mem_mb"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=512, help="GPT width (default 512: 25 M parameters with 8 layers)")
    p.add_argument("--layers", type=int, default=8, help="GPT blocks (default 8)")
    p.add_argument("--nproc", type=int, default=2, help="ranks: DDP over them, pp over them (default 2)")
    p.add_argument("--batch-size", type=int, default=8, help="global batch, small: the state dominates (default 8)")
    p.add_argument("--steps", type=int, default=3, help="steps per run (AdamW's state exists from the first)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each layout, alternated (medians)")
    p.add_argument("--binding", default="exclusive", help="numarun --binding (default exclusive)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run before it counts as hung")
    args = p.parse_args()

    layouts = {
        "ddp": ["parallel=ddp"],
        f"pp={args.nproc}": ["parallel=fsdp", f"parallel.pp={args.nproc}", f"parallel.pp_microbatches={args.nproc}"],
    }
    peaks: dict[str, list[list[float]]] = {k: [] for k in layouts}
    above: dict[str, list[list[float]]] = {k: [] for k in layouts}
    with tempfile.TemporaryDirectory(prefix="numarun-bench-pp-") as tmp:
        for i in range(args.rounds):
            order = list(layouts) if i % 2 == 0 else list(reversed(layouts))
            for name in order:
                s = _run(layouts[name], args=args, run_dir=Path(tmp) / f"{name.replace('=', '')}-{i}")
                peaks[name].append(s["peak_mem_mb_per_rank"])
                above[name].append([pk - b for pk, b in zip(s["peak_mem_mb_per_rank"], s["base_mem_mb_per_rank"])])
                if name != "ddp":
                    pipeline = s["pipeline"]
    med = {k: [statistics.median(r[j] for r in v) for j in range(args.nproc)] for k, v in peaks.items()}
    med_above = {k: [statistics.median(r[j] for r in v) for j in range(args.nproc)] for k, v in above.items()}
    pp = f"pp={args.nproc}"
    params = 12 * args.d_model**2 * args.layers + (256 + 32 + 256) * args.d_model
    print(
        f"GPT d_model={args.d_model} layers={args.layers} (~{params / 1e6:.1f} M parameters), AdamW, global batch "
        f"{args.batch_size}, {args.nproc} ranks, {args.rounds} round(s); {pp}: {pipeline}"
    )
    print(
        f"{'rank':>4}  {'ddp peak MiB':>12}  {pp + ' peak MiB':>13}  {'ddp above start':>15}  {pp + ' above start':>16}"
    )
    for j in range(args.nproc):
        print(
            f"{j:>4}  {med['ddp'][j]:>12.1f}  {med[pp][j]:>13.1f}  {med_above['ddp'][j]:>15.1f}  "
            f"{med_above[pp][j]:>16.1f}"
        )
    ratio = max(med[pp]) / max(med["ddp"])
    ratio_above = max(med_above[pp]) / max(med_above["ddp"])
    print(f"largest rank: {pp} / ddp = {ratio:.2f} of the peak, {ratio_above:.2f} of the memory above the start")
    print(f"PP_MEMORY peak={ratio:.3f} above_start={ratio_above:.3f}")


if __name__ == "__main__":
    main()
