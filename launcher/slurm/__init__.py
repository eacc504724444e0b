"""SLURM support: ``numarun submit`` renders an sbatch script (one numarun per node) and submits it.

Modules: ``nodelist`` (hostlist expansion), ``options`` (option validation), ``script``
(render the sbatch script from ``templates/``), ``submit`` (sbatch/squeue/scontrol).
"""
