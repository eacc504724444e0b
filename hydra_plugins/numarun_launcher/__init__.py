"""numarun's Hydra launchers (``hydra/launcher=numarun`` and ``numarun_slurm``), found by Hydra's plugin discovery."""
