"""``hydra/launcher=numarun``: each job of any sweeper as a numarun job, packed side by side on the node's
GPUs and cores; ``hydra/launcher=numarun_slurm``: the jobs as a Slurm job array. Thin: the work is
:func:`numarun.sweep.launch.launch`, imported only when a sweep starts."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class NumarunLauncherConf:
    _target_: str = "hydra_plugins.numarun_launcher.numarun_launcher.NumarunLauncher"
    nproc_per_node: int | None = None
    """Ranks of each job (None: 1; numarun's trainer: its launcher.nproc_per_node)."""
    max_jobs: int | None = None
    """Jobs running at once (None: one per slot of the node)."""
    options: list[str] = field(default_factory=list)
    """More 'numarun run' options for every job, e.g. [--binding, node]."""


@dataclass
class NumarunSlurmLauncherConf(NumarunLauncherConf):
    _target_: str = "hydra_plugins.numarun_launcher.numarun_launcher.NumarunSlurmLauncher"
    nnodes: int = 1
    pack: int | None = None
    """Jobs per array task, packed on its node (None: one job per array task, on whole nodes)."""
    submit_options: list[str] = field(default_factory=list)
    """'numarun submit' options, e.g. [--partition, gpu, --time, '1:00:00']."""
    dry_run: bool = False
    """Print the sbatch script and submit nothing."""


ConfigStore.instance().store(group="hydra/launcher", name="numarun", node=NumarunLauncherConf, provider="numarun")
ConfigStore.instance().store(
    group="hydra/launcher", name="numarun_slurm", node=NumarunSlurmLauncherConf, provider="numarun"
)


class NumarunLauncher(Launcher):
    slurm = False

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.composed: dict[tuple[str, ...], Any] = {}
        """Jobs' configs composed before the sweep, by their overrides (numarun's trainer checks every job first)."""

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from numarun.sweep.launch import launch

        return launch(self, job_overrides, initial_job_idx)


class NumarunSlurmLauncher(NumarunLauncher):
    slurm = True
