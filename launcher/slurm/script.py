"""Render the sbatch script for a job. Pure: a :class:`SlurmJob` in, the script text out.

The template (``templates/sbatch.sh.in``) is data; this module fills its ``@@NAME@@`` slots.
Every user value (script path, arguments, overrides, environment values, paths) goes through
:func:`shlex.quote`, so ``x=$(touch /tmp/pwned)`` reaches the job as those exact bytes.
Header (``#SBATCH``) values are read by sbatch without a shell; they are validated in
:mod:`numarun.slurm.options` instead.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from importlib import resources

from .node import shutdown_grace
from .options import SlurmOptions, format_time

TEMPLATE = "sbatch.sh.in"
_SLOT = re.compile(r"@@([A-Z_]+)@@")


@dataclass(frozen=True)
class SlurmJob:
    """Everything the batch script needs; built by ``numarun submit``, rendered by :func:`render_sbatch`."""

    script: str
    """The training script, as an absolute path (the job may start in another directory), or the
    module name when ``module`` is set."""
    output_dir: str
    """Absolute root for run dirs (``<output_dir>/<job id>``) and Slurm logs."""
    options: SlurmOptions = field(default_factory=SlurmOptions)
    arg_sets: tuple[tuple[str, ...], ...] = ((),)
    """Arguments after the script; one tuple per array index (a multirun sweep), else one."""
    env: tuple[tuple[str, str], ...] = ()
    """``export KEY=VALUE`` lines for the job."""
    numarun: tuple[str, ...] = ("numarun",)
    """How the compute nodes start numarun (e.g. ``/repo/.venv/bin/numarun``)."""
    launch_opts: tuple[str, ...] = ()
    """Extra ``numarun run`` flags (``--binding exclusive`` ...), passed before the script."""
    hydra_run_dir: bool = False
    """Append ``hydra.run.dir=<run dir>`` to the arguments (for Hydra scripts)."""
    module: bool = False
    """``script`` is a module run as ``numarun run -m MODULE`` (e.g. ``numarun.train``)."""

    @property
    def is_array(self) -> bool:
        return len(self.arg_sets) > 1


def _q(words: tuple[str, ...] | list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def _sbatch_lines(job: SlurmJob) -> list[str]:
    o = job.options
    lines = [f"--job-name={o.job_name}", f"--nodes={o.nodes}", "--ntasks-per-node=1"]
    # optional '--flag=value' lines, in this order, for the options the user set
    optional = {
        "cpus-per-task": o.cpus_per_task,
        "gpus-per-node": o.effective_gpus_per_node,
        "mem": o.mem,
        "partition": o.partition,
        "account": o.account,
        "qos": o.qos,
        "constraint": o.constraint,
    }
    lines += [f"--{flag}={value}" for flag, value in optional.items() if value is not None]
    if o.whole_nodes:
        # every CPU (and, with --gpus-per-node above, every GPU) of each node
        lines.append("--exclusive")
    if o.time is not None:
        lines.append(f"--time={format_time(o.time_limit_seconds)}")
    lines += [
        # one log per job (per array index)
        f"--output={job.output_dir}/{'slurm-%A_%a.out' if job.is_array else 'slurm-%j.out'}",
        # a requeued run appends to the same log instead of truncating it
        "--open-mode=append",
        # B: signal the batch shell only; it forwards TERM to the ranks and requeues.
        f"--signal=B:USR1@{o.effective_signal_before}",
        "--requeue",
    ]
    if job.is_array:
        lines.append(f"--array=0-{len(job.arg_sets) - 1}")
    lines += list(o.extra_sbatch)
    return ["#SBATCH " + line for line in lines]


def _args_block(job: SlurmJob) -> str:
    if not job.is_array:
        return f"args=({_q(job.arg_sets[0])})"
    return "\n".join(
        [
            'case "${SLURM_ARRAY_TASK_ID:-}" in',
            *(f"  {i}) args=({_q(arg_set)}) ;;" for i, arg_set in enumerate(job.arg_sets)),
            f"  *) echo \"numarun: error: array index '${{SLURM_ARRAY_TASK_ID:-}}' not in 0-{len(job.arg_sets) - 1}\" "
            ">&2; exit 2 ;;",
            "esac",
        ]
    )


def _launch_opts(job: SlurmJob) -> tuple[str, ...]:
    opts = job.launch_opts
    if job.options.nproc_per_node is not None:
        opts += ("--nproc-per-node", str(job.options.nproc_per_node))
    if not any(o.split("=", 1)[0] in ("--shutdown-timeout", "--shutdown_timeout") for o in opts):
        # torchrun's agent sends KILL this long after TERM: the ranks' checkpoint must fit
        opts += ("--shutdown-timeout", str(shutdown_grace(job.options.effective_signal_before)))
    if job.module:
        opts += ("--module",)  # last, right before the module name
    return opts


def render_sbatch(job: SlurmJob) -> str:
    """The complete sbatch script for ``job`` (validates its options first; ``numarun submit`` checked the rest as it
    built the job)."""
    job.options.validate()
    slots = {
        "SBATCH": "\n".join(_sbatch_lines(job)),
        "NUMARUN": _q(job.numarun),
        "SCRIPT": shlex.quote(job.script),
        "ARGS": _args_block(job),
        "LAUNCH_OPTS": _q(_launch_opts(job)),
        "REQUESTED": f"# Requested: {job.options.requested()}",
        "REQUEUE_LIMIT": str(job.options.requeue_limit),
        "OUTPUT_ROOT": shlex.quote(job.output_dir),
        "HYDRA_RUN_DIR": "1" if job.hydra_run_dir else "0",
        "ENV": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in job.env),
    }
    # one pass: a filled-in value that contains '@@X@@' is never substituted again
    template = resources.files("numarun.slurm").joinpath("templates").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return _SLOT.sub(lambda m: slots[m.group(1)], template)
