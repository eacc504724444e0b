"""``numarun slurm-node``: the per-node entry of numarun's sbatch script (see numarun.slurm.node)."""

from ..slurm.node import add_parser

__all__ = ["add_parser"]
