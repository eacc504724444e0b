"""One base error for every user mistake numarun can name: the CLI prints it on one line, no traceback, and exits 2."""

from __future__ import annotations

DOCS_URL = "https://numarun.github.io/numarun/"
"""The documentation site (``mkdocs.yml``'s ``site_url``): help screens and error lines name its pages."""


def page_url(page: str) -> str:
    """The address of a docs page given by its source path: ``slurm.md#x`` -> ``<DOCS_URL>slurm/#x``."""
    path, _, anchor = page.partition("#")
    path = "" if path == "index.md" else path.removesuffix(".md") + "/"
    return DOCS_URL + path + (f"#{anchor}" if anchor else "")


class NumarunError(Exception):
    """A user-facing error: bad input, an impossible request, an unreadable source."""

    exit_code: int = 2
    page: str | None = None
    """The docs page (its path under ``docs/``) that explains this kind of mistake; the error line names it."""

    def line(self) -> str:
        """The one line numarun prints for this error."""
        see = f" (see {page_url(self.page)})" if self.page else ""
        return f"numarun: error: {self}{see}"


class UsageError(NumarunError):
    """A command-line flag or argument has a bad value."""


class CpuListError(NumarunError):
    """A CPU/node list such as ``0-3,8`` could not be parsed."""


class TopologyError(NumarunError):
    """A topology source (sysfs tree, JSON snapshot, nvidia-smi text) is unreadable or malformed."""

    page = "topology.md"


class VisibleDevicesError(NumarunError):
    """``CUDA_VISIBLE_DEVICES`` names GPUs that do not exist or repeats one."""

    page = "topology.md"


class PlanError(NumarunError):
    """The requested binding cannot be planned on this topology (too few cores or GPUs...)."""

    page = "binding.md"


class BindingError(NumarunError):
    """A binding could not be applied and ``--strict-binding`` was given."""

    page = "binding.md"


class ConfigError(NumarunError):
    """A Hydra config or override is wrong (unknown key, bad type, bad value)."""

    page = "hydra.md"


class TrainerLayoutError(ConfigError):
    """The trainer's layout (``parallel.*``) does not fit the world, the model or the pipeline schedule."""

    page = "trainer.md"


class CheckpointError(NumarunError):
    """A checkpoint must not be loaded (damaged, not trusted: exit 2) or cannot be written (disk full: exit 1)."""

    page = "reliability.md"

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OutputError(NumarunError):
    """Standard output or a result file could not be written (a full disk, a closed pipe): exit 1."""

    exit_code = 1


class SlurmError(NumarunError):
    """A SLURM option is malformed or sbatch/squeue failed."""

    page = "slurm.md"


def expected(value: object, form: str, what: str = "value") -> str:
    """Uniform wording: ``bad <what> '<value>': expected <form>``."""
    return f"bad {what} {value!r}: expected {form}"
