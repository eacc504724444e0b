"""One base error for every user mistake numarun can name: the CLI prints it on one line, no traceback, and exits 2."""

from __future__ import annotations


class NumarunError(Exception):
    """A user-facing error: bad input, an impossible request, an unreadable source."""

    exit_code: int = 2


class UsageError(NumarunError):
    """A command-line flag or argument has a bad value."""


class CpuListError(NumarunError):
    """A CPU/node list such as ``0-3,8`` could not be parsed."""


class TopologyError(NumarunError):
    """A topology source (sysfs tree, JSON snapshot, nvidia-smi text) is unreadable or malformed."""


class VisibleDevicesError(NumarunError):
    """``CUDA_VISIBLE_DEVICES`` names GPUs that do not exist or repeats one."""


class PlanError(NumarunError):
    """The requested binding cannot be planned on this topology (too few cores or GPUs...)."""


class BindingError(NumarunError):
    """A binding could not be applied and ``--strict-binding`` was given."""


class ConfigError(NumarunError):
    """A Hydra config or override is wrong (unknown key, bad type, bad value)."""


class CheckpointError(NumarunError):
    """A checkpoint must not be loaded (damaged, not trusted: exit 2) or cannot be written (disk full: exit 1)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OutputError(NumarunError):
    """Standard output or a result file could not be written (a full disk, a closed pipe): exit 1."""

    exit_code = 1


class SlurmError(NumarunError):
    """A SLURM option is malformed or sbatch/squeue failed."""


def expected(value: object, form: str, what: str = "value") -> str:
    """Uniform wording: ``bad <what> '<value>': expected <form>``."""
    return f"bad {what} {value!r}: expected {form}"
