"""Composition of numarun's trainer config, by Hydra itself, once, in the launcher.

The only module that drives Hydra. ``numarun run`` hands the arguments after the trainer
script to :func:`run_hydra`, which does what ``@hydra.main`` does with them: ``--cfg
job|hydra|all``, ``--info``, ``--help``, ``--hydra-help``, ``-cn/-cp/-cd`` and ``-m``
behave as in any Hydra app and the first five create no run dir. For each job (one, or
every job of Hydra's own sweeper, one after another) Hydra composes the config against
:class:`~numarun.config.schema.JobConfig`, creates the run dir and writes
``.hydra/{config,hydra,overrides}.yaml`` (``multirun.yaml`` for a sweep); numarun then
resolves the config once (``${now:}``, ``${hydra:runtime.output_dir}``...) into
``<run dir>/config.yaml`` (:mod:`numarun.config.files`), which every rank reads through
``NUMARUN_CONFIG``, and runs the job. A wrong key, type or value is a ``ConfigError``
(one line) before the job's run dir exists.

:func:`compose_dry` composes without Hydra's run machinery, for ``--dry-run``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import envvars
from ..errors import ConfigError, NumarunError
from .detect import AppKind, detect_app  # noqa: F401  (re-exported: submit reads them from here)
from .files import PreparedJob, prepare_job
from .rundir import check_run_dir
from .schema import JobConfig

SCHEMA_NAME = "numarun_schema"
TASK_NAME = "train"
"""``hydra.job.name`` of numarun's trainer (the script is scripts/train.py or numarun.train)."""
VERSION_BASE = "1.3"

# Hydra's own command-line flags that print something and run nothing.
_INFO_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--shell-completion", "-sc")


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


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)


def is_info_command(script_args: Sequence[str]) -> bool:
    """True for ``--cfg``/``--info``/``--help``...: Hydra prints and no job runs."""
    return any(a in _INFO_FLAGS or a.startswith(("--cfg=", "--info=")) for a in script_args)


_checks: list[Callable[[PreparedJob], Any]] = []
"""The check of the :func:`run_hydra` call under way (plans the job): run before Hydra makes a run dir."""


class _Stopped(BaseException):
    """Carries an error through Hydra's ``except Exception`` (per job, per callback): a refused
    run dir or value, or a signal stop, ends the command there."""

    def __init__(self, error: NumarunError) -> None:
        super().__init__(str(error))
        self.error = error


def _parse(script_args: Sequence[str]) -> Any:
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str) -> None:
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: {message}; expected "
            "key=value overrides and Hydra's flags (-m, -cn NAME, --cfg job...)"
        )

    parser.error = refuse  # type: ignore[method-assign,assignment]
    return parser, parser.parse_args(list(script_args))


@contextlib.contextmanager
def _hydra(args: Any) -> Iterator[tuple[Any, str]]:
    """Hydra's application object for numarun's configs (``-cp``/``-cd`` as in any Hydra app)."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    version.setbase(VERSION_BASE)
    _register_schema()
    # -cp relative to the working directory: the trainer's "calling file" is numarun's own
    config_path = os.path.abspath(args.config_path) if args.config_path else str(config_dir())
    if not os.path.isdir(config_path):
        raise ConfigError(f"bad --config-path {args.config_path!r}: no such directory; expected a directory of configs")
    search_path = create_automatic_config_search_path(None, None, config_path)
    if args.config_dir is not None:
        from hydra.core.config_search_path import SearchPathQuery

        extra = os.path.abspath(args.config_dir)
        if not os.path.isdir(extra):
            raise ConfigError(f"bad --config-dir {args.config_dir!r}: no such directory; expected a directory of configs")
        search_path.prepend(provider="command-line", path=f"file://{extra}", anchor=SearchPathQuery(provider="schema"))
    GlobalHydra.instance().clear()
    try:
        yield Hydra.create_main_hydra2(task_name=TASK_NAME, config_search_path=search_path), (args.config_name or "config")
    finally:
        GlobalHydra.instance().clear()


def _callback_base() -> type:
    from hydra.experimental.callback import Callback

    return Callback


class RunDirGuard(_callback_base()):  # type: ignore[misc]
    """Hydra callback (named in configs/config.yaml): checks run dirs and values before Hydra makes a dir."""

    def on_run_start(self, config: Any, **_kwargs: Any) -> None:
        try:
            self._check_run(config)
        except NumarunError as e:  # Hydra turns a callback's Exception into a warning
            raise _Stopped(e) from None

    def on_multirun_start(self, config: Any, **_kwargs: Any) -> None:
        try:
            check_run_dir(Path(str(config.hydra.sweep.dir)))
        except NumarunError as e:
            raise _Stopped(e) from None

    @staticmethod
    def _check_run(config: Any) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import open_dict, read_write

        run_dir = Path(os.path.abspath(str(config.hydra.run.dir)))
        check_run_dir(run_dir)
        probe = copy.deepcopy(config)
        with read_write(probe), open_dict(probe):
            probe.hydra.runtime.output_dir = str(run_dir)
        saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(probe)
        try:
            job = prepare_job(probe, run_dir, [str(o) for o in config.hydra.overrides.task], write=False)
            for check in _checks:  # a bad value or an impossible plan: no run dir yet
                check(job)
        finally:
            if saved is not None:
                HydraConfig.instance().cfg = saved


def run_hydra(
    script_args: Sequence[str], on_job: Callable[[PreparedJob], Any], check_job: Callable[[PreparedJob], Any] | None = None
) -> Any:
    """Run Hydra's command for ``script_args``; ``on_job`` runs each composed, saved job.

    ``check_job`` sees every job (not yet written) before Hydra creates the first run dir,
    so that a job that cannot run (an impossible plan) leaves nothing behind.
    Returns the last job's ``on_job`` value (None for --cfg/--info/--help).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    parser, args = _parse(script_args)
    overrides = list(args.overrides)
    results: list[Any] = []

    def task(cfg: Any) -> Any:
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        job = prepare_job(cfg, run_dir, [str(o) for o in hc.overrides.task], write=True)
        try:
            value = on_job(job)
        except NumarunError as e:
            if getattr(e, "exit_code", 0) >= 128:  # numarun was stopped by a signal: no next job
                raise _Stopped(e) from None
            raise
        results.append(value)
        return value

    try:
        with _hydra(args) as (hydra, config_name):
            if args.help:
                hydra.app_help(config_name=config_name, args_parser=parser, args=args)
                return None
            if args.hydra_help:
                hydra.hydra_help(config_name=config_name, args_parser=parser, args=args)
                return None
            if args.cfg:
                hydra.show_cfg(
                    config_name=config_name, overrides=overrides, cfg_type=args.cfg, package=args.package, resolve=args.resolve
                )
                return None
            if args.info:
                # Hydra gives the info its own stdout handler on the root logger: ours would double it
                root = logging.getLogger()
                handlers = root.handlers[:]
                for h in handlers:
                    root.removeHandler(h)
                try:
                    hydra.show_info(args.info, config_name=config_name, overrides=overrides)
                finally:
                    for h in root.handlers[:]:
                        root.removeHandler(h)
                    for h in handlers:
                        root.addHandler(h)
                return None
            if args.shell_completion:
                hydra.shell_completion(config_name=config_name, overrides=overrides)
                return None
            # as Hydra's _run_app: the mode from the config unless -m says otherwise
            mode = hydra.get_mode(config_name=config_name, overrides=overrides)
            if mode is None or (args.multirun and mode == RunMode.RUN):
                mode = RunMode.MULTIRUN if args.multirun else RunMode.RUN
                overrides.append(f"hydra.mode={mode.name}")
            _checks[:] = [check_job] if check_job is not None else []
            if mode == RunMode.RUN:
                hydra.run(config_name=config_name, task_function=task, overrides=overrides)
            else:
                for _, job in _every_job(hydra, config_name, list(args.overrides), multirun=True):
                    for check in _checks:
                        check(job)
                _checks.clear()  # checked whole; Hydra's own per-job run needs no second check
                hydra.multirun(config_name=config_name, task_function=task, overrides=overrides)
    except _Stopped as s:
        raise s.error from None
    except NumarunError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError) as e:  # before OSError: MissingConfigException is one
        raise ConfigError(explain(e, list(args.overrides))) from None
    except RecursionError:
        raise too_deep(list(args.overrides), config=_config_label(args)) from None
    except OSError as e:  # Hydra's mkdir of the run dir
        if e.filename is None:
            raise
        raise ConfigError(f"bad run dir {e.filename!r}: {e.strerror}; expected a writable directory path") from None
    finally:
        _checks.clear()
    return results[-1] if results else None


def prepare_launch(script_args: Sequence[str]) -> PreparedJob:
    """One trainer job composed, its run dir made and its files written, nothing run (``-m`` refused)."""
    if any(a in MULTIRUN_FLAGS for a in script_args):
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: a sweep; expected one job (sweeps run through numarun)"
        )
    if is_info_command(script_args):
        raise ConfigError(
            f"bad trainer arguments {' '.join(script_args)!r}: --cfg/--info/--help run nothing; expected key=value overrides"
        )
    return run_hydra(script_args, lambda job: job)


def compose_dry(script_args: Sequence[str]) -> list[tuple[Path, PreparedJob]]:
    """(run dir, job) of every job a real run would make, composed by Hydra; nothing is created."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _, args = _parse(script_args)
    try:
        with _hydra(args) as (hydra, config_name):
            return _every_job(hydra, config_name, list(args.overrides), multirun=args.multirun)
    except NumarunError:
        raise
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(explain(e, list(args.overrides))) from None
    except RecursionError:
        raise too_deep(list(args.overrides), config=_config_label(args)) from None


def _every_job(hydra: Any, config_name: str, overrides: list[str], *, multirun: bool) -> list[tuple[Path, PreparedJob]]:
    """Each job composed as Hydra's basic sweeper composes it, and checked; nothing is written.

    A sweep is checked whole before its first job starts (Hydra's sweeper checks the
    overrides of a batch the same way), so a bad value in its last job runs nothing.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    loader = hydra.config_loader
    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    base = loader.load_configuration(config_name=config_name, overrides=overrides + [f"hydra.mode={mode.name}"], run_mode=mode)
    configs: list[tuple[Any, int | None]] = []
    if mode == RunMode.RUN:
        configs.append((base, None))
    else:
        parsed = OverridesParser.create().parse_overrides(overrides)
        for i, job_overrides in enumerate(BasicSweeper.split_arguments(parsed, None)[0]):
            job_cfg = loader.load_sweep_config(base, list(job_overrides))
            with read_write(job_cfg.hydra), open_dict(job_cfg.hydra):
                job_cfg.hydra.job.num = i
                job_cfg.hydra.job.id = str(i)
            configs.append((job_cfg, i))
    saved = HydraConfig.instance().cfg
    jobs = []
    try:
        for cfg, num in configs:
            HydraConfig.instance().set_config(cfg)
            raw = cfg.hydra.run.dir if num is None else os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir))
            run_dir = Path(os.path.abspath(str(raw)))
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.runtime.output_dir = str(run_dir)
            HydraConfig.instance().set_config(cfg)
            overrides_task = [str(o) for o in cfg.hydra.overrides.task]
            jobs.append((run_dir, prepare_job(cfg, run_dir, overrides_task, write=False)))
    finally:
        HydraConfig.instance().cfg = saved
    return jobs


MULTIRUN_FLAGS = ("-m", "--multirun")


def split_args(script_args: list[str]) -> tuple[list[str], list[str], bool]:
    """(overrides, other args, multirun) from the arguments after the script."""
    overrides, other, multirun = [], [], False
    for a in script_args:
        if a in MULTIRUN_FLAGS:
            multirun = True
        elif not a.startswith("-") and ("=" in a or a.startswith("~")):
            overrides.append(a)
        else:
            other.append(a)
    return overrides, other, multirun


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The jobs of a basic sweep, in Hydra's order (the first key varying slowest)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]]
    except HydraException as e:
        raise ConfigError(f"bad overrides {' '.join(overrides)!r}: {_first_line(e)}; expected key=value or key=a,b,c") from None


def compose(overrides: list[str]) -> Any:
    """The trainer's config for ``overrides`` (hydra node included), for settings that need no run dir."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _, args = _parse(list(overrides))
    try:
        with _hydra(args) as (hydra, config_name):
            return hydra.compose_config(config_name=config_name, overrides=list(args.overrides), run_mode=_run_mode())
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(explain(e, list(overrides))) from None
    except RecursionError:
        raise too_deep(list(overrides)) from None


def _run_mode() -> Any:
    from hydra.types import RunMode

    return RunMode.RUN


def _first_line(e: BaseException) -> str:
    for line in str(e).splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__


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
        detail = _first_line(cause)
        if detail not in text:
            text = f"{text} ({detail})"
    text = text.split(" Config search path:")[0]
    culprit = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") in text), None)
    what = f"bad override {culprit!r}" if culprit else f"bad config (overrides {' '.join(overrides) or 'none'!r})"
    return f"{what}: {text}; expected the keys, types and group options of numarun's job config"
