"""Every use of Hydra's private parts, in one place: what each is for and the shape it is used in.

Hydra has a public API for an application's author (``@hydra.main``, ``compose``) but none for
a program that runs Hydra apps on someone's behalf. numarun does that in two places:

* **in the launcher**, for numarun's own trainer (:mod:`numarun.config.compose`): it does what
  ``@hydra.main`` does with the arguments after the script, but runs each job itself, so that
  every job is composed once and checked before any run dir exists;
* **in each worker**, for a user's ``@hydra.main`` app (:mod:`numarun.worker.hydra_pin`): every
  rank's Hydra computes the same run dir from one clock, and rank 0 alone writes Hydra's files.
  :func:`worker_hook` patches ``hydra.core.utils`` right after the user's script first imports
  it.

:data:`SHAPES` names each private part used, what for, and its parameters as read on the Hydra
versions in :data:`CHECKED` (pyproject pins ``hydra-core`` to them).
``tests/toplevel/test_hydra_internals.py`` fails when an installed Hydra changes any of them, so the next
Hydra is checked on purpose. No other module imports ``hydra._internal`` or patches Hydra.

Nothing here imports Hydra or OmegaConf at import time: the worker bootstrap imports this
module, and a script that never imports Hydra pays nothing for it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

CHECKED = ((1, 3), (1, 3))
"""hydra-core versions (inclusive, major.minor) whose private parts used here were read and tested."""

SHAPES: dict[str, tuple[tuple[str, ...] | None, str]] = {
    "hydra._internal.utils.get_args_parser": (
        (),
        "Hydra's own command line (-m, -cn, -cp, -cd, --cfg, --info...), parsed as in any Hydra app",
    ),
    "hydra._internal.utils.create_automatic_config_search_path": (
        ("calling_file", "calling_module", "config_path"),
        "the config search path @hydra.main builds, for numarun's configs/",
    ),
    "hydra._internal.hydra.Hydra.create_main_hydra2": (
        ("task_name", "config_search_path"),
        "the application object @hydra.main builds",
    ),
    "hydra._internal.hydra.Hydra.app_help": (("config_name", "args_parser", "args"), "--help"),
    "hydra._internal.hydra.Hydra.hydra_help": (("config_name", "args_parser", "args"), "--hydra-help"),
    "hydra._internal.hydra.Hydra.show_cfg": (
        ("config_name", "overrides", "cfg_type", "package", "resolve"),
        "--cfg job|hydra|all",
    ),
    "hydra._internal.hydra.Hydra.show_info": (("info", "config_name", "overrides", "run_mode"), "--info"),
    "hydra._internal.hydra.Hydra.shell_completion": (("config_name", "overrides"), "--shell-completion"),
    "hydra._internal.hydra.Hydra.get_mode": (("config_name", "overrides"), "RUN or MULTIRUN, from -m and hydra.mode"),
    "hydra._internal.hydra.Hydra.compose_config": (
        ("config_name", "overrides", "run_mode", "with_log_configuration", "from_shell", "validate_sweep_overrides"),
        "the config of a run, or of a sweep (its multirun.yaml), with Hydra's logging set up from it",
    ),
    "hydra._internal.hydra.Hydra.config_loader": (
        None,
        "the loader of the app's configs: one job of a sweep, glob() sweeps",
    ),
    "hydra._internal.config_loader_impl.ConfigLoaderImpl.load_sweep_config": (
        ("master_config", "sweep_overrides"),
        "one job of a sweep composed as Hydra's launchers compose it",
    ),
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments": (
        ("overrides", "max_batch_size"),
        "Hydra's basic sweep expansion: the one place a sweep becomes jobs",
    ),
    "hydra._internal.callbacks.Callbacks": (("config",), "the callbacks named in hydra.callbacks"),
    "hydra._internal.callbacks.Callbacks.on_run_start": (("config", "kwargs"), "called where Hydra's run calls it"),
    "hydra._internal.callbacks.Callbacks.on_run_end": (("config", "kwargs"), "called where Hydra's run calls it"),
    "hydra._internal.callbacks.Callbacks.on_multirun_start": (
        ("config", "kwargs"),
        "called where Hydra's multirun calls it",
    ),
    "hydra._internal.callbacks.Callbacks.on_multirun_end": (
        ("config", "kwargs"),
        "called where Hydra's multirun calls it",
    ),
    "hydra.core.utils.run_job": (
        ("task_function", "config", "job_dir_key", "job_subdir_key", "hydra_context", "configure_logging"),
        "one job as Hydra's launchers run it: run dir, .hydra/*.yaml, job logging, env_set, job callbacks",
    ),
    "hydra.core.plugins.Plugins.instantiate_sweeper": (
        ("hydra_context", "task_function", "config"),
        "a sweep by any sweeper plugin, as Hydra's multirun runs it",
    ),
    "hydra.core.plugins.Plugins.instantiate_launcher": (
        ("hydra_context", "task_function", "config"),
        "the configured launcher, for the jobs of a basic sweep",
    ),
    "hydra.core.utils.configure_log": (
        ("log_config", "verbose_config"),
        "Hydra's logging set up again after each job of a sweep",
    ),
    "hydra.core.hydra_config.HydraConfig.cfg": (
        None,
        "assigned to put back the global Hydra config after a composition (set_config refuses None)",
    ),
    "hydra.version.setbase": (("ver",), "version_base, as @hydra.main(version_base=...) sets it"),
    # worker side: a user's @hydra.main app in every rank
    "hydra.core.utils.datetime": (None, "the class the ${now:} resolver reads at call time: replaced by a fixed clock"),
    "hydra.core.utils.setup_globals": (
        (),
        "registers that ${now:} resolver (read at call time, so the patch reaches it)",
    ),
    "hydra.core.utils._save_config": (("cfg", "filename", "output_dir"), "writes .hydra/*.yaml: a no-op off rank 0"),
}
"""Private part -> (its parameters without ``self``, or None for an attribute; what numarun uses it for)."""

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
"""``_target_`` of the sweeper and launcher whose work :mod:`numarun.config.compose` does itself
(any other sweeper or launcher plugin runs as Hydra runs it)."""

MULTIRUN_YAML = "multirun.yaml"
"""The sweep's config, which Hydra's basic sweeper saves in the sweep dir."""

WORKER_MODULE = "hydra.core.utils"
"""The module :func:`worker_hook` patches, right after it is first executed."""


# --- launcher side -----------------------------------------------------------------------------


def args_parser() -> argparse.ArgumentParser:
    """Hydra's own parser of an app's command line."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def create_app(*, task_name: str, config_path: str, extra_dir: str | None, version_base: str) -> Any:
    """Hydra's application object for the configs in ``config_path`` (and ``extra_dir``, ``-cd``),
    made the global Hydra, as ``@hydra.main`` creates it."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    set_version_base(version_base)
    search_path = create_automatic_config_search_path(None, None, config_path)
    if extra_dir is not None:
        search_path.prepend(
            provider="command-line", path=f"file://{extra_dir}", anchor=SearchPathQuery(provider="schema")
        )
    return Hydra.create_main_hydra2(task_name=task_name, config_search_path=search_path)


def set_version_base(base: str | None) -> None:
    """Hydra's ``version_base`` for this process, as ``@hydra.main(version_base=...)`` sets it."""
    from hydra import version

    version.setbase(base)


def split_sweep(overrides: Sequence[str], config_loader: Any = None) -> list[list[str]]:
    """Hydra's basic sweeper's jobs for ``overrides``, one override list each (the first key varying slowest)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(overrides))
    (jobs,) = BasicSweeper.split_arguments(parsed, None)  # one batch: numarun runs the jobs one by one
    return [list(job) for job in jobs]


def load_sweep_job(app: Any, sweep_cfg: Any, overrides: Sequence[str]) -> Any:
    """One job of a sweep composed from the sweep's config and the job's overrides (``${now:}`` values shared)."""
    return app.config_loader.load_sweep_config(sweep_cfg, list(overrides))


def callbacks(cfg: Any) -> Any:
    """The callbacks named in ``cfg.hydra.callbacks``, instantiated as Hydra's run and multirun do (``cfg`` None:
    none)."""
    from hydra._internal.callbacks import Callbacks

    return Callbacks(cfg)


def job_dir(cfg: Any, *, sweep: bool) -> Path:
    """The run dir :func:`run_job` makes for ``cfg`` (absolute), computed as it computes it."""
    from omegaconf import OmegaConf

    path = str(OmegaConf.select(cfg, "hydra.sweep.dir" if sweep else "hydra.run.dir"))
    if sweep:
        path = os.path.join(path, str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
    return Path(os.path.abspath(path))


def run_job(loader: Any, cfg: Any, task: Callable[[Any], Any], hooks: Any, *, sweep: bool) -> Any:
    """``task`` run as Hydra's launchers run a job: run dir made, ``.hydra/*.yaml`` written, job
    logging and ``env_set`` set up, ``hooks`` told. Returns Hydra's ``JobReturn``, whose
    ``return_value`` raises the task's exception. ``loader``: the app's config loader (None in a rank)."""
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext

    return hydra_run_job(
        task_function=task,
        config=cfg,
        job_dir_key="hydra.sweep.dir" if sweep else "hydra.run.dir",
        job_subdir_key="hydra.sweep.subdir" if sweep else None,
        hydra_context=HydraContext(config_loader=loader, callbacks=hooks),
    )


def plugin(app: Any, cfg: Any, task: Callable[[Any], Any], hooks: Any, *, group: str) -> Any:
    """``cfg``'s ``sweeper`` or ``launcher`` plugin (``group``), set up as Hydra's multirun sets it up."""
    from hydra.core.plugins import Plugins
    from hydra.errors import HydraException
    from hydra.types import HydraContext

    context = HydraContext(config_loader=app.config_loader, callbacks=hooks)
    try:
        return getattr(Plugins.instance(), f"instantiate_{group}")(
            hydra_context=context, task_function=task, config=cfg
        )
    except (RuntimeError, ImportError) as e:  # a plugin Hydra cannot find or load: one line, as Hydra's own errors
        raise HydraException(str(e)) from None


def raw_value(ret: Any) -> Any:
    """What a job returned or raised, as a ``JobReturn`` holds it (reading ``ret.return_value`` of a failed
    job raises)."""
    return ret._return_value


def job_value(ret: Any) -> Any:
    """``ret.return_value``; numarun's own error is raised without Hydra's "Error executing job
    with overrides" line before it (it is its own one line)."""
    from .errors import NumarunError

    if ret.status.name == "FAILED" and isinstance(raw_value(ret), NumarunError):
        raise raw_value(ret)
    return ret.return_value


def configure_hydra_logging(cfg: Any) -> None:
    """Hydra's own logging set up again from ``cfg``, as its basic launcher does after each job."""
    from hydra.core.utils import configure_log

    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)


@contextlib.contextmanager
def hydra_config(cfg: Any) -> Iterator[None]:
    """``cfg`` as Hydra's global config (what ``${hydra:...}`` reads) inside the block, the previous one after."""
    from hydra.core.hydra_config import HydraConfig

    saved = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = saved


# --- worker side -------------------------------------------------------------------------------


def worker_hook(when: _dt.datetime, *, writer: bool) -> Callable[[Any], None]:
    """The patch of :data:`WORKER_MODULE` in a worker: Hydra's clock fixed at ``when``; unless
    ``writer``, no ``.hydra/*.yaml`` written by this process."""

    class Pinned(_dt.datetime):
        """A ``datetime`` class whose ``now()`` is always ``when``."""

        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return when if tz is None else when.astimezone(tz)

    def hook(utils: Any) -> None:
        # setup_globals' ${now:} resolver reads this module's global 'datetime' at call time
        utils.datetime = Pinned
        if not writer:
            utils._save_config = lambda *_a, **_k: None  # .hydra/*.yaml

    return hook
