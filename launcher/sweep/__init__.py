"""Hydra sweeps with ``hydra/launcher=numarun`` (and ``numarun_slurm``): each job of any sweeper a numarun
job, packed on the node's slots (:mod:`numarun.plan.pack`). How and why: docs/sweeps.md."""
