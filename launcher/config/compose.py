"""Composition of numarun's trainer config, by Hydra, once per job, in the launcher.

``numarun run`` hands the arguments after the trainer script to :func:`run_hydra`, which does
what ``@hydra.main`` does with them: ``--cfg job|hydra|all``, ``--info``, ``--help``,
``--hydra-help``, ``-cn/-cp/-cd`` and ``-m`` behave as in any Hydra app, and the commands that
only print create no run dir. Every job then goes through four steps:

1. **compose** (:func:`_compose`): Hydra composes the config against
   :class:`~numarun.config.schema.JobConfig`. A sweep (``-m``) is split into jobs by
   :func:`expand_sweep`, the one place a sweep becomes jobs, and each job is composed once,
   as Hydra's basic sweeper composes it.
2. **prepare** (:func:`_prepare`): the job's run dir is computed and its config resolved once
   (``${now:}``, ``${hydra:runtime.output_dir}``...) and validated
   (:func:`numarun.config.files.prepare_job`). Nothing is written.
3. **check**: before any directory exists, a real run refuses run dirs through planted links
   (:func:`_check_run_dirs`), and the caller's ``check`` sees every job, so that a bad value in
   a sweep's last job runs nothing. The trainer's callers pass its pre-flight
   (:func:`numarun.train.preflight.check_prepared`: checkpoint dir, checkpoints, token file)
   and ``numarun run`` its launch plan; config/ itself imports nothing of the trainer.
4. **run** (:func:`_run`): each job in turn goes through Hydra's own job runner, which makes the
   run dir and writes ``.hydra/{config,hydra,overrides}.yaml`` (``multirun.yaml`` for a sweep);
   numarun adds the resolved ``<run dir>/config.yaml``, which every rank reads through
   ``NUMARUN_CONFIG``, and ``on_job`` runs the job.

A wrong key, type or value is a ``ConfigError`` (one line) before any run dir exists.
:func:`compose_dry` stops after step 3, for ``--dry-run`` and ``numarun submit``. The parts of
Hydra this needs beyond its public API are in :mod:`numarun.hydra_internals`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import envvars
from .. import hydra_internals as internals
from ..errors import ConfigError, NumarunError, first_line
from .files import PreparedJob, prepare_job, running_job, save_job
from .rundir import check_run_dir
from .schema import JobConfig

log = logging.getLogger(__name__)

SCHEMA_NAME = "numarun_schema"
TASK_NAME = "train"
"""``hydra.job.name`` of numarun's trainer (the script is scripts/train.py or numarun.train)."""
VERSION_BASE = "1.3"
TRAINER_TASK = "numarun.train.entry:hydra_task"
"""The trainer as a Hydra task in each rank, for a launcher that runs jobs elsewhere (``hydra/launcher=numarun``)."""

MULTIRUN_FLAGS = ("-m", "--multirun")
"""Hydra's flags that make the arguments a sweep."""
_INFO_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc")
"""Hydra's own command-line flags that print something and run nothing."""

JobCheck = Callable[[PreparedJob], object]
"""A check of one composed job, run on every job before any run dir exists; raises to refuse it."""


def config_dir() -> Path:
    """numarun's ``configs/``: ``$NUMARUN_CONFIG_DIR``, else the package's own copy.

    The package's ``configs/`` comes first (in a checkout it is a link to the top-level
    ``configs/``); the folder beside the package is looked at last, and only in a checkout,
    because in an installed tree it would be ``site-packages/configs``, anybody's folder.
    """
    env = os.environ.get(envvars.CONFIG_DIR)
    candidates = [Path(env)] if env else []
    package = Path(__file__).resolve().parents[1]
    candidates.append(package / "configs")
    if (package.parent / "pyproject.toml").is_file():
        candidates.append(package.parent / "configs")
    for c in candidates:
        if (c / "config.yaml").is_file():
            return c
    raise ConfigError(
        f"bad config dir {str(candidates[0])!r}: expected a directory holding config.yaml "
        f"(set {envvars.CONFIG_DIR} to numarun's configs/)"
    )


def is_info_command(script_args: Sequence[str]) -> bool:
    """True for ``--cfg``/``--info``/``--help``...: Hydra prints and no job runs."""
    return any(a in _INFO_FLAGS or a.startswith(("--cfg=", "--info=")) for a in script_args)


# --- the entry points -------------------------------------------------------------------------


def run_hydra(script_args: Sequence[str], on_job: Callable[[PreparedJob], Any], check: JobCheck | None = None) -> Any:
    """Run Hydra's command for ``script_args``; ``on_job`` runs each composed, saved job.

    ``check`` sees every job (not yet written) before the first run dir is made, so that a job
    that cannot run (a bad input, an impossible plan) leaves nothing behind. Returns the last
    job's ``on_job`` value (None for --cfg/--info/--help).
    """
    parser, args = _parse(script_args)
    with _one_line_errors(args), _app(args) as (app, config_name):
        if _print_only(app, parser, args, config_name):
            return None
        command = _compose(app, config_name, args, log_configuration=True)
        _check_run_dirs(command)
        _check(command, check)
        return _run(app, config_name, command, on_job, check)


def compose_dry(script_args: Sequence[str], check: JobCheck | None = None) -> list[tuple[Path, PreparedJob]]:
    """(run dir, job) of every job a real run would make, composed and checked as it would be; nothing is created."""
    _, args = _parse(script_args)
    with _one_line_errors(args), _app(args) as (app, config_name):
        command = _compose(app, config_name, args, log_configuration=False)
        _check(command, check)
        return [(job.prepared.run_dir, job.prepared) for job in command.jobs]


def prepare_launch(script_args: Sequence[str], check: JobCheck | None = None) -> PreparedJob:
    """One trainer job composed, its run dir made and its files written, nothing run (``-m`` refused)."""
    if any(a in MULTIRUN_FLAGS for a in script_args):
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: a sweep; expected one job (sweeps run through numarun)"
        )
    if is_info_command(script_args):
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: --cfg/--info/--help run nothing; expected key=value "
            "overrides"
        )
    return run_hydra(script_args, lambda job: job, check)


def compose(overrides: Sequence[str]) -> Any:
    """The trainer's config for ``overrides`` (hydra node included, unresolved), for settings that need no run dir."""
    from hydra.types import RunMode

    _, args = _parse(overrides)
    with _one_line_errors(args), _app(args) as (app, config_name):
        return app.compose_config(config_name=config_name, overrides=list(args.overrides), run_mode=RunMode.RUN)


def expand_sweep(overrides: Sequence[str], *, config_loader: Any = None) -> list[list[str]]:
    """The jobs of a basic sweep, one override list each, in Hydra's order (the first key varying slowest).

    The only expansion of a sweep: ``numarun run -m`` runs these jobs and ``numarun submit -m``
    makes one array task of each. ``config_loader`` lets ``glob(...)`` see the config groups.
    """
    from hydra.errors import HydraException

    try:
        return internals.split_sweep(overrides, config_loader)
    except HydraException as e:
        raise ConfigError(
            f"bad overrides {' '.join(overrides)!r}: {first_line(e)}; expected key=value or key=a,b,c"
        ) from None


def sweep_arg_sets(script_args: Sequence[str]) -> list[list[str]]:
    """The script arguments of each job: ``script_args`` itself, or with ``-m`` one set per job of
    the sweep (that job's overrides, then the other arguments; no ``-m``)."""
    if not any(a in MULTIRUN_FLAGS for a in script_args):
        return [list(script_args)]
    overrides = [a for a in script_args if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    other = [a for a in script_args if a not in MULTIRUN_FLAGS and a not in overrides]
    return [job + other for job in expand_sweep(overrides)]


# --- the steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    cfg: Any
    """The job's config as Hydra composed it (``hydra`` node included): what Hydra's job runner gets."""
    prepared: PreparedJob


@dataclass(frozen=True)
class _Command:
    cfg: Any
    """The command's config: the one job's own, or the sweep's (saved as ``multirun.yaml``)."""
    sweep_dir: Path | None
    """The sweep's dir (``hydra.sweep.dir``); None for one job (``hydra.run.dir``)."""
    jobs: tuple[_Job, ...]
    """Every job; () when a sweeper plugin makes them as it goes (Optuna...)."""


class _Stopped(BaseException):
    """Carries a signal stop past Hydra's job runner (which records any ``Exception`` and goes
    on with the next job): numarun was stopped, so no next job starts."""

    def __init__(self, error: NumarunError) -> None:
        super().__init__(str(error))
        self.error = error


def _parse(script_args: Sequence[str]) -> Any:
    parser = internals.args_parser()

    def refuse(message: str) -> None:
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: {message}; expected "
            "key=value overrides and Hydra's flags (-m, -cn NAME, --cfg job...)"
        )

    parser.error = refuse  # type: ignore[method-assign,assignment]
    return parser, parser.parse_args(list(script_args))


@contextlib.contextmanager
def _app(args: Any) -> Iterator[tuple[Any, str]]:
    """Hydra's application object for numarun's configs (``-cp``/``-cd`` as in any Hydra app), and the config name."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)
    # -cp relative to the working directory: the trainer's "calling file" is numarun's own
    config_path = os.path.abspath(args.config_path) if args.config_path else str(config_dir())
    if not os.path.isdir(config_path):
        raise ConfigError(f"bad --config-path {args.config_path!r}: no such directory; expected a directory of configs")
    extra = None
    if args.config_dir is not None:
        extra = os.path.abspath(args.config_dir)
        if not os.path.isdir(extra):
            raise ConfigError(
                f"bad --config-dir {args.config_dir!r}: no such directory; expected a directory of configs"
            )
    GlobalHydra.instance().clear()
    try:
        app = internals.create_app(
            task_name=TASK_NAME, config_path=config_path, extra_dir=extra, version_base=VERSION_BASE
        )
        yield app, (args.config_name or "config")
    finally:
        GlobalHydra.instance().clear()


@contextlib.contextmanager
def _one_line_errors(args: Any) -> Iterator[None]:
    """Hydra's and OmegaConf's errors (and a run dir Hydra cannot make) as one-line ConfigErrors."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(args.overrides)
    try:
        yield
    except _Stopped as s:
        raise s.error from None
    except NumarunError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError) as e:  # before OSError: MissingConfigException is one
        raise ConfigError(explain(e, overrides)) from None
    except RecursionError:
        raise too_deep(overrides, config=_config_label(args)) from None
    except OSError as e:  # Hydra's mkdir of the run dir
        if e.filename is None:
            raise
        raise ConfigError(f"bad run dir {e.filename!r}: {e.strerror}; expected a writable directory path") from None


def _print_only(app: Any, parser: Any, args: Any, config_name: str) -> bool:
    """Hydra's commands that print and run nothing (--help, --hydra-help, --cfg, --info, -sc); False for a run."""
    overrides = list(args.overrides)
    if args.help:
        app.app_help(config_name=config_name, args_parser=parser, args=args)
    elif args.hydra_help:
        app.hydra_help(config_name=config_name, args_parser=parser, args=args)
    elif args.cfg:
        app.show_cfg(
            config_name=config_name, overrides=overrides, cfg_type=args.cfg, package=args.package, resolve=args.resolve
        )
    elif args.info:
        # Hydra gives the info its own stdout handler on the root logger: ours would double it
        root = logging.getLogger()
        handlers, root.handlers = root.handlers, []
        try:
            app.show_info(args.info, config_name=config_name, overrides=overrides)
        finally:
            root.handlers = handlers
    elif args.shell_completion:
        app.shell_completion(config_name=config_name, overrides=overrides)
    else:
        return False
    return True


def _compose(app: Any, config_name: str, args: Any, *, log_configuration: bool) -> _Command:
    """Step 1 and 2: the command's config, and each of its jobs composed once and prepared."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    overrides = list(args.overrides)
    # as Hydra's own _run_app: the mode from the config unless -m says otherwise
    mode = app.get_mode(config_name=config_name, overrides=overrides)
    if mode is None or (args.multirun and mode == RunMode.RUN):
        mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
        overrides.append(f"hydra.mode={mode.name}")
    cfg = app.compose_config(
        config_name=config_name, overrides=overrides, run_mode=mode, with_log_configuration=log_configuration
    )
    if mode == RunMode.RUN:
        return _Command(cfg, sweep_dir=None, jobs=(_prepare(cfg, sweep=False),))
    # the sweep dir first, as Hydra's sweeper does: its ${now:} is then cached, and every job copies the cache
    with internals.hydra_config(cfg):
        sweep_dir = Path(str(cfg.hydra.sweep.dir))
    if cfg.hydra.sweeper.get("_target_") != internals.BASIC_SWEEPER:
        return _Command(cfg, sweep_dir=sweep_dir, jobs=())
    # as Hydra's basic sweeper: hydra.sweeper.params, then the command line's own overrides
    params = [f"{k}={v}" for k, v in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items()]
    task_overrides = [str(o) for o in cfg.hydra.overrides.task]
    jobs = []
    for num, job_overrides in enumerate(expand_sweep([*params, *task_overrides], config_loader=app.config_loader)):
        job_cfg = internals.load_sweep_job(app, cfg, job_overrides)
        with open_dict(job_cfg):
            job_cfg.hydra.job.id = job_cfg.hydra.job.num = num
        jobs.append(_prepare(job_cfg, sweep=True))
    return _Command(cfg, sweep_dir=sweep_dir, jobs=tuple(jobs))


def _prepare(cfg: Any, *, sweep: bool) -> _Job:
    """Step 2: the job's run dir and its resolved, validated config; nothing written."""
    from omegaconf import open_dict, read_write

    with internals.hydra_config(cfg):  # ${hydra:...} in the run dir's own path
        run_dir = internals.job_dir(cfg, sweep=sweep)
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(run_dir)  # as Hydra's job runner will set it
    with internals.hydra_config(cfg):  # ${hydra:runtime.output_dir} in the job's values
        prepared = prepare_job(cfg, run_dir, [str(o) for o in cfg.hydra.overrides.task])
    return _Job(cfg, prepared)


def _check_run_dirs(command: _Command) -> None:
    """No run dir to be made through a planted link (only for a real run: ``submit`` and
    ``--dry-run`` make none here)."""
    for d in ([command.sweep_dir] if command.sweep_dir is not None else []) + [
        j.prepared.run_dir for j in command.jobs
    ]:
        check_run_dir(d)


def _check(command: _Command, check: JobCheck | None) -> None:
    """Step 3: every job checked before the first run dir is made."""
    if check is not None:
        for job in command.jobs:
            check(job.prepared)


def _run(
    app: Any, config_name: str, command: _Command, on_job: Callable[[PreparedJob], Any], check: JobCheck | None = None
) -> Any:
    """Step 4, as Hydra's run, or multirun with its basic sweeper and launcher, runs the jobs.

    Another sweeper or launcher (``hydra/launcher=numarun``) runs as Hydra runs it, after the
    jobs of a basic sweep were checked. A failed job does not stop a sweep: the first failure is
    raised once every job ran, as Hydra's sweeper does; numarun stopped by a signal (exit code
    >= 128) ends it at once.
    """
    from omegaconf import OmegaConf

    hooks = internals.callbacks(command.cfg)

    def task_of(job: PreparedJob) -> Callable[[Any], Any]:
        def task(_cfg: Any) -> Any:
            # Hydra passes its copy of the config; numarun's was resolved in step 2, and Hydra made
            # the run dir computed there (the same config object, whose ${now:} values are cached)
            save_job(job)
            try:
                return on_job(job)
            except NumarunError as e:
                if e.exit_code >= 128:
                    raise _Stopped(e) from None
                raise

        return task

    def any_task(cfg: Any) -> Any:  # a job as Hydra's run_job runs it, outside a basic sweep
        job = running_job(cfg)
        if check is not None:
            check(job)
        return task_of(job)(cfg)

    any_task.numarun_task = TRAINER_TASK  # type: ignore[attr-defined]
    if command.sweep_dir is None:
        (job,) = command.jobs
        hooks.on_run_start(config=command.cfg, config_name=config_name)
        ret = internals.run_job(app.config_loader, job.cfg, task_of(job.prepared), hooks, sweep=False)
        hooks.on_run_end(config=command.cfg, config_name=config_name, job_return=ret)
        return internals.job_value(ret)
    hooks.on_multirun_start(config=command.cfg, config_name=config_name)
    launcher = None
    if command.jobs and command.cfg.hydra.launcher.get("_target_") != internals.BASIC_LAUNCHER:
        launcher = internals.plugin(app, command.cfg, any_task, hooks, group="launcher")
    if not command.jobs or (launcher is not None and not isinstance(getattr(launcher, "composed", None), dict)):
        # another sweeper or launcher: as Hydra's multirun runs them
        sweeper = internals.plugin(app, command.cfg, any_task, hooks, group="sweeper")
        values = [sweeper.sweep(arguments=[str(o) for o in command.cfg.hydra.overrides.task])]
    else:
        command.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(command.cfg, command.sweep_dir / internals.MULTIRUN_YAML)
        log.info("sweep of %d jobs in %s", len(command.jobs), command.sweep_dir)
        if launcher is not None:  # numarun's launcher, in the basic sweeper's batches: the jobs composed here, once
            values = _launch(launcher, command)
        else:
            returns = []
            for job in command.jobs:
                returns.append(internals.run_job(app.config_loader, job.cfg, task_of(job.prepared), hooks, sweep=True))
                internals.configure_hydra_logging(command.cfg)
            values = [internals.job_value(r) for r in returns]
    hooks.on_multirun_end(config=command.cfg, config_name=config_name)
    return values[-1] if values else None


def _launch(launcher: Any, command: _Command) -> list[Any]:
    """The jobs through numarun's Hydra launcher as Hydra's basic sweeper hands them over (``max_batch_size`` at a
    time, a failed job raised after its batch), with the configs composed and checked before (it composes none)."""
    size = command.cfg.hydra.sweeper.get("max_batch_size") or len(command.jobs)
    values = []
    for start in range(0, len(command.jobs), size):
        batch = command.jobs[start : start + size]
        launcher.composed.update((tuple(j.prepared.overrides), j.cfg) for j in batch)
        for ret in launcher.launch([list(j.prepared.overrides) for j in batch], initial_job_idx=start):
            values.append(internals.job_value(ret))
    return values


# --- one-line errors ---------------------------------------------------------------------------


def _config_label(args: Any) -> str:
    name = getattr(args, "config_name", None)
    where = getattr(args, "config_dir", None) or getattr(args, "config_path", None)
    return f"{where}/{name}" if name and where else (name or "")


def too_deep(overrides: list[str], *, config: str = "") -> ConfigError:
    """A config or override nested past what Hydra and OmegaConf can walk (they recurse), in one line."""
    from ..jsonable import MAX_DEPTH

    def nesting(o: str) -> int:
        return o.count("[") + o.count("{")

    deepest = max(overrides, key=nesting, default="")
    if nesting(deepest) > MAX_DEPTH:
        shown = deepest if len(deepest) <= 40 else deepest[:40] + "..."
        what = f"bad override {shown!r}"
    elif config:
        what = f"bad config {config!r}"
    else:
        what = f"bad config (overrides {' '.join(overrides) or 'none'!r})"
    return ConfigError(f"{what}: nested too deep for Hydra to read; expected values nested at most {MAX_DEPTH} levels")


def explain(e: BaseException, overrides: list[str]) -> str:
    """One line: which override, what Hydra/OmegaConf said, what was expected."""
    text = " ".join(
        line.strip()
        for line in str(e).splitlines()
        if line.strip() and not line.strip().startswith(("full_key", "object_type", "reference_type"))
    )
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip():
        detail = first_line(cause)
        if detail not in text:
            text = f"{text} ({detail})"
    text = text.split(" Config search path:")[0]
    culprit = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") in text), None)
    what = f"bad override {culprit!r}" if culprit else f"bad config (overrides {' '.join(overrides) or 'none'!r})"
    return f"{what}: {text}; expected the keys, types and group options of numarun's job config"
