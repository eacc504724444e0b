"""The error tree: every error numarun raises for others to catch is defined here, under one base,
:class:`NumarunError`, which the CLI prints on one line (no traceback) and exits with its code (2: a user mistake).

An error carries its context in attributes (the exit code, the docs page, the node that saw a conflict, where a
layout was declared); its text is built once, where it is raised, and nothing matches or rewrites it afterwards."""

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

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)  # exit_code: this error's own, where its kind has several (else the class's)
        if exit_code is not None:
            self.exit_code = exit_code

    def line(self) -> str:
        """The one line numarun prints for this error."""
        see = f" (see {page_url(self.page)})" if self.page else ""
        return f"numarun: error: {self}{see}"


class UsageError(NumarunError):
    """A command-line flag or argument has a bad value."""


class JobConflict(UsageError):
    """An explicit option contradicts the job the scheduler started."""

    page = "slurm.md"

    def __init__(self, message: str, *, node_varying: bool = False) -> None:
        super().__init__(message)
        self.node_varying = node_varying
        """The conflict may hold on some nodes only (``--node-rank``): the other nodes, which see nothing wrong,
        must be told to stop."""


TRAINER_LAYOUT = "parallel.*"
"""Where numarun's trainer declares its layout (its config's ``parallel`` group), as messages name it."""


class LayoutError(UsageError):
    """A parallel layout that cannot be read, or that does not fit the job, the model or the pipeline schedule:
    ``--mesh`` (``NUMARUN_MESH``, ``launcher.mesh``; errors name layouts.md) or the trainer's ``parallel.*`` (errors
    name trainer.md)."""

    page = "layouts.md"

    def __init__(self, message: str, *, where: str) -> None:
        super().__init__(message)
        self.where = where
        """Where the layout was declared: ``--mesh``, ``NUMARUN_MESH``, ``launcher.mesh`` or :data:`TRAINER_LAYOUT`."""
        if where == TRAINER_LAYOUT:
            self.page = "trainer.md"


class CpuListError(NumarunError):
    """A CPU/node list such as ``0-3,8`` could not be parsed."""


class SchemaError(NumarunError, ValueError):
    """A JSON value does not have the shape of its type (the message names the path); also a ValueError, as JSON's
    own errors are, for readers that skip what does not parse."""


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


class CheckpointError(NumarunError):
    """A checkpoint must not be loaded (damaged, not trusted: exit 2) or cannot be written (disk full: exit 1)."""

    page = "reliability.md"


class OutputError(NumarunError):
    """Standard output or a result file could not be written (a full disk, a closed pipe): exit 1."""

    exit_code = 1


class SlurmError(NumarunError):
    """A SLURM option is malformed or sbatch/squeue failed."""

    page = "slurm.md"


class ControllerError(SlurmError):
    """slurmctld did not answer a question whose answer every node must agree on."""


class DistInitError(NumarunError):
    """The worker's distributed environment is missing or inconsistent."""


class HierarchyError(NumarunError):
    """Hierarchical communication was asked for on a job whose nodes cannot form it."""


class RunFailed(NumarunError):
    """A worker failed (its exit code is the run's) or numarun was stopped by a signal."""


class DoctorError(NumarunError):
    """The nodes could not complete the doctor's exchange (a node missing, a stream cut)."""

    exit_code = 1


class PreflightFailed(NumarunError):
    """``--preflight``: the doctor found an error on a node, and the job was not started (exit 1)."""

    exit_code = 1
    page = "doctor.md"


class TuneRunFailed(NumarunError):
    """A candidate's run exited non-zero."""

    exit_code = 1


class NoStepReport(NumarunError):
    """The job runs but has no step report (yet, or it is off): exit 3, try again later; one that cannot be read
    (another numarun's format): exit 1."""

    exit_code = 3
    page = "steps.md"


class StacksUnavailable(NumarunError):
    """A job's roll-call could not be had: no job runs, or its numarun did not answer (exit 1)."""

    exit_code = 1
    page = "hangs.md"


def first_line(e: BaseException) -> str:
    """An error's first line with text (Hydra's and OmegaConf's run on with context, torch's with C++ frames), else
    its type's name."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def expected(value: object, form: str, what: str = "value") -> str:
    """Uniform wording: ``bad <what> '<value>': expected <form>``."""
    return f"bad {what} {value!r}: expected {form}"
