"""Hydra sweeps the Hydra way: ``hydra/launcher=numarun`` (and ``numarun_slurm``) for any sweeper.

The plugin (``hydra_plugins/numarun_launcher``) hands each batch of jobs to
:func:`numarun.sweep.launch.launch`: every job is composed as Hydra's basic launcher composes
it and written to a private folder; on one node the jobs run as a queue on the slots of
:func:`numarun.plan.pack.pack`, each confined to its slot and bound by its own plan; with
``numarun_slurm`` they become a job array of ``numarun submit``. In each rank,
:mod:`numarun.sweep.job` runs the job through Hydra's ``run_job``, and rank 0 hands the
``JobReturn`` back to the sweeper.
"""
