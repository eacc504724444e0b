"""Resolve a Hydra job config ONCE, in the launcher, into one run directory.

The only module that imports Hydra. ``numarun run`` calls :func:`prepare_sweep` (or
:func:`prepare_launch` for one job) before any worker starts: overrides are composed and
validated against :class:`~numarun.config.schema.JobConfig` (a wrong key or type is a
``ConfigError``, one line, and no run dir is created), the run dir is created, the
resolved ``config.yaml`` and ``overrides.yaml`` are saved there, and every rank reads that
same file through ``NUMARUN_CONFIG`` — no per-rank composition, no ``${now:}`` drift.

Two kinds of scripts are Hydra apps:

* scripts that run numarun's trainer (their source mentions ``numarun.train``, or the
  module ``numarun.train``): composed from numarun's ``configs/``;
* a user's own ``@hydra.main`` script: composed from the ``config_path``/``config_name``
  of its decorator; the launcher writes ``.hydra/`` once and every rank gets
  ``hydra.run.dir=<run dir> hydra.output_subdir=null``, so all ranks share one run dir
  and none writes ``.hydra/`` again.

Any other script is not touched (:func:`prepare_launch` returns None).
"""

from __future__ import annotations

import ast
import contextlib
import datetime as _dt
import enum
import itertools
import logging
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..fsutil import write_atomic
from .schema import JobConfig

log = logging.getLogger(__name__)

SCHEMA_NAME = "numarun_schema"
MULTIRUN_FLAGS = ("-m", "--multirun")
# launcher settings handed to `numarun run` (flag given by the user wins)
LAUNCHER_KEYS = (
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "binding",
    "mem_policy",
    "nic_policy",
    "master_addr",
    "master_port",
    "rdzv_endpoint",
    "rdzv_id",
    "strict_binding",
)


class AppKind(str, enum.Enum):
    """What kind of script numarun is about to launch."""

    TRAINER = "trainer"
    """numarun's reference trainer (numarun.train): numarun's configs/ and schema."""
    HYDRA_MAIN = "hydra-main"
    """A user's own ``@hydra.main`` script: its own config dir."""
    PLAIN = "plain"
    """Not a Hydra app: arguments are passed through untouched."""


@dataclass(frozen=True)
class PreparedJob:
    """One job resolved by the launcher, ready for ``numarun run``."""

    kind: AppKind
    run_dir: Path
    config_file: Path
    """``<run dir>/config.yaml``: what every rank reads."""
    overrides: tuple[str, ...]
    script_args: tuple[str, ...]
    """Arguments for the script (replace the user's)."""
    launcher: Mapping[str, Any] = field(default_factory=dict)
    """Settings from the ``launcher`` group (values as plain str/int/bool; None = unset)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every worker."""


# ----------------------------------------------------------------------------- locating


def config_dir() -> Path:
    """numarun's ``configs/``: ``$NUMARUN_CONFIG_DIR``, else the package's own copy.

    The package's ``configs/`` comes first (in a checkout it is a link to the top-level
    ``configs/``); the folder beside the package is looked at last, and only in a checkout,
    because in an installed tree it would be ``site-packages/configs``, anybody's folder.
    """
    env = os.environ.get("NUMARUN_CONFIG_DIR")
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
        "(set NUMARUN_CONFIG_DIR to numarun's configs/)"
    )


def detect_app(target: str, *, is_module: bool) -> AppKind:
    """TRAINER, HYDRA_MAIN or PLAIN, from the module name or the script's source."""
    if is_module:
        if target == "numarun.train" or target.startswith("numarun.train."):
            return AppKind.TRAINER
        import importlib.util

        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return AppKind.PLAIN
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return AppKind.PLAIN
        path = Path(spec.origin)
    else:
        path = Path(target)
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return AppKind.PLAIN
    if _hydra_main_args(source) is not None:
        return AppKind.HYDRA_MAIN
    if re.search(r"\bnumarun\.train\b|from\s+numarun\s+import\s+train\b", source):
        return AppKind.TRAINER
    return AppKind.PLAIN


def _hydra_main_args(source: str) -> dict[str, Any] | None:
    """The literal keyword arguments of a ``@hydra.main(...)`` decorator, or None."""
    if "main" not in source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {} if "@hydra.main" in source else None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            f = dec.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            if name == "main" and owner == "hydra":
                kwargs: dict[str, Any] = {}
                for i, arg in enumerate(dec.args[:3]):
                    kwargs[("config_path", "config_name", "version_base")[i]] = _literal(arg)
                for kw in dec.keywords:
                    if kw.arg:
                        kwargs[kw.arg] = _literal(kw.value)
                return kwargs
    return None


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- arguments


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
    """The jobs of a basic sweep: the cartesian product of every ``key=a,b,c`` (Hydra's grammar,
    so ``range()``/``choice()`` work too), in order, the first key varying slowest."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(f"bad overrides {' '.join(overrides)!r}: {_first_line(e)}; expected key=value or key=a,b,c") from None
    choices: list[list[str]] = []
    for o in parsed:
        if o.is_sweep_override():
            key = o.get_key_element()
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(job) for job in itertools.product(*choices)]


# ----------------------------------------------------------------------------- composing


@contextlib.contextmanager
def _hydra_context(directory: Path | None) -> Iterator[None]:
    from hydra import initialize, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    if directory is None:
        ctx = initialize(version_base=None, config_path=None)
    else:
        ctx = initialize_config_dir(config_dir=str(directory), version_base=None)
    with ctx:
        yield


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=JobConfig)


def compose(overrides: list[str], *, directory: Path | None = None, config_name: str | None = "config", schema: bool = True) -> Any:
    """Compose ``config_name`` in ``directory`` with ``overrides`` (hydra node included).

    Raises ConfigError with one line for an unknown key, a bad type or a bad group choice.
    """
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if schema:
        _register_schema()
    try:
        with _hydra_context(directory if directory is not None else config_dir()):
            return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(_explain(e, overrides)) from None


def _first_line(e: BaseException) -> str:
    for line in str(e).splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__


def _explain(e: BaseException, overrides: list[str]) -> str:
    """One line: which override, what Hydra/OmegaConf said, what was expected."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip() and not line.strip().startswith(("full_key", "object_type", "reference_type")))
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip():
        detail = _first_line(cause)
        if detail not in text:
            text = f"{text} ({detail})"
    text = text.split(" Config search path:")[0]
    culprit = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") in text), None)
    what = f"bad override {culprit!r}" if culprit else f"bad config (overrides {' '.join(overrides) or 'none'!r})"
    return f"{what}: {text}; expected the keys, types and group options of the job config (configs/)"


def _job_yaml(cfg: Any, *, resolve: bool) -> str:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    try:
        return OmegaConf.to_yaml(job, resolve=resolve)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad config value: {_first_line(e)}; expected every ??? value to be given as an override") from None


def _run_dir_from(cfg: Any) -> tuple[Path, bool]:
    """The run dir Hydra's config names (``hydra.run.dir``) and whether the user set it."""
    from omegaconf import OmegaConf

    explicit = any(o.split("=", 1)[0].lstrip("+") == "hydra.run.dir" for o in cfg.hydra.overrides.hydra)
    raw = OmegaConf.select(cfg, "hydra.run.dir", default=None, throw_on_resolution_failure=False)
    if not raw:
        raw = _dt.datetime.now().strftime("outputs/%Y-%m-%d/%H-%M-%S")
    return Path(os.path.abspath(str(raw))), explicit


# ----------------------------------------------------------------------------- run dir I/O


def make_run_dir(path: Path, *, explicit: bool) -> Path:
    """Create the run dir with the user's umask and never through a symlink planted at its name.

    An explicit dir may exist already (a real directory, reused as Hydra does); a default
    ``outputs/<date>/<time>`` that exists (two jobs in one second) gets a ``_N`` suffix.
    """
    if not explicit:
        # The shared default root: an 'outputs' or 'outputs/<date>' planted as a symlink
        # would send this run's files wherever it points. Checked before anything is created.
        for parent in (path.parent.parent, path.parent):
            if parent.is_symlink():
                raise ConfigError(
                    f"bad run dir {str(path)!r}: {str(parent)!r} is a symbolic link; "
                    "expected real directories under the default outputs/ (or hydra.run.dir=DIR)"
                )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"bad run dir {str(path)!r}: {e.strerror}; expected a writable directory path") from None
    candidate = path
    for n in range(1, 1000):
        try:
            os.mkdir(candidate)  # mkdir(2) does not follow a symlink at the last component
            return candidate
        except FileExistsError:
            st = os.lstat(candidate)
            if stat.S_ISLNK(st.st_mode):
                raise ConfigError(f"bad run dir {str(candidate)!r}: it is a symbolic link; expected a new or existing real directory") from None
            if not stat.S_ISDIR(st.st_mode):
                raise ConfigError(f"bad run dir {str(candidate)!r}: it exists and is not a directory; expected a directory path") from None
            if explicit:
                return candidate
            candidate = path.with_name(f"{path.name}_{n}")
        except OSError as e:
            raise ConfigError(f"bad run dir {str(candidate)!r}: {e.strerror}; expected a writable directory path") from None
    raise ConfigError(f"bad run dir {str(path)!r}: too many runs in one second; expected hydra.run.dir=DIR")


def write_text_nofollow(path: Path, text: str) -> None:
    """Write a file atomically, refusing a symlink planted at its name.

    The text goes to a fresh temp file beside it (O_EXCL) and is renamed over the name:
    on a multi-node job every node's numarun writes the same config into the shared run
    dir, and a rank must never read a half-written one. A rename replaces a link rather
    than writing through it, and a planted link is refused outright.
    """
    if path.is_symlink():
        raise ConfigError(f"bad run dir file {str(path)!r}: it is a symbolic link; expected a regular file")
    try:
        write_atomic(path, text)
    except OSError as e:
        raise ConfigError(f"bad run dir file {str(path)!r}: {e.strerror}; expected a writable path") from None


def _overrides_yaml(overrides: list[str]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(list(overrides)))


# ----------------------------------------------------------------------------- entry points


def prepare_launch(target: str, script_args: list[str], *, is_module: bool) -> PreparedJob | None:
    """Compose, validate and save the config of one job; None when the script is not a Hydra app.

    A multirun with more than one job is refused here: use :func:`prepare_sweep`.
    """
    jobs = prepare_sweep(target, script_args, is_module=is_module)
    if jobs is None:
        return None
    if len(jobs) != 1:
        raise ConfigError(f"bad overrides {' '.join(script_args)!r}: a sweep of {len(jobs)} jobs; expected one job (use prepare_sweep)")
    return jobs[0]


def prepare_sweep(target: str, script_args: list[str], *, is_module: bool, dry_run: bool = False) -> list[PreparedJob] | None:
    """All jobs of the command line (one unless ``-m`` with ``a,b`` sweeps), each with its run dir.

    Every job is composed and validated before any run dir is created, so a bad value in
    the 3rd job of a sweep stops the whole command before anything starts. ``dry_run``:
    validate and name the run dirs, create and write nothing.
    """
    kind = detect_app(target, is_module=is_module)
    if kind is AppKind.PLAIN:
        return None
    overrides, other, multirun = split_args(list(script_args))
    if kind is AppKind.TRAINER and other:
        raise ConfigError(f"bad argument {other[0]!r}: expected key=value overrides (and -m for a sweep) after the trainer script")
    job_overrides = expand_sweep(overrides) if multirun else [overrides]
    if kind is AppKind.TRAINER:
        composed = [_compose_trainer(ov) for ov in job_overrides]
    else:
        composed = [_compose_user(target, ov, is_module=is_module) for ov in job_overrides]
    sweep_base: Path | None = None
    if multirun and len(job_overrides) > 1:
        sweep_base = _sweep_dir(composed[0][0], create=not dry_run)
    jobs = []
    for i, (cfg, ov) in enumerate(zip(composed, job_overrides)):
        run_dir, explicit = _run_dir_from(cfg[0])
        if sweep_base is not None and not explicit:
            run_dir, explicit = sweep_base / str(i), True
        if not dry_run:
            run_dir = make_run_dir(run_dir, explicit=explicit)
        jobs.append(_save(kind, cfg, ov, other, run_dir, write=not dry_run))
    return jobs


def _sweep_dir(cfg: Any, *, create: bool) -> Path:
    from omegaconf import OmegaConf

    raw = OmegaConf.select(cfg, "hydra.sweep.dir", default=None, throw_on_resolution_failure=False)
    if not raw:
        raw = _dt.datetime.now().strftime("multirun/%Y-%m-%d/%H-%M-%S")
    base = Path(os.path.abspath(str(raw)))
    return make_run_dir(base, explicit=False) if create else base


def _compose_trainer(overrides: list[str]) -> tuple[Any, str, str | None]:
    cfg = compose(overrides)
    text = _job_yaml(cfg, resolve=True)
    from .schema import load_job_config_text

    job = load_job_config_text(text, origin="composed config")  # value checks the types cannot express
    from ..train.preflight import check_job

    check_job(job, run_dir=_run_dir_from(cfg)[0])  # checkpoint dir, checkpoints, data: before any run dir
    return cfg, text, None


def _compose_user(target: str, overrides: list[str], *, is_module: bool) -> tuple[Any, str, str | None]:
    """A user's @hydra.main app: compose from its decorator's config dir when it can be found."""
    path = Path(target) if not is_module else None
    if path is None:
        import importlib.util

        spec = importlib.util.find_spec(target)
        path = Path(spec.origin) if spec and spec.origin else None
    args = _hydra_main_args(path.read_text(encoding="utf-8")) if path else {}
    args = args or {}
    config_path, config_name = args.get("config_path"), args.get("config_name")
    directory = (path.parent / config_path).resolve() if (path and config_path) else None
    if directory is None:
        # no config dir: compose the overrides alone (Hydra's defaults + the user's keys)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            cfg = compose(overrides, directory=Path(tmp), config_name=None, schema=False)
    else:
        cfg = compose(overrides, directory=directory, config_name=config_name, schema=False)
    text = _job_yaml(cfg, resolve=False)
    return cfg, text, "user"


def _save(kind: AppKind, composed: tuple[Any, str, str | None], overrides: list[str], other: list[str], run_dir: Path, *, write: bool = True) -> PreparedJob:
    cfg, text, hydra_text = composed
    if not write:
        write_text = lambda path, text: None  # noqa: E731
    else:
        write_text = write_text_nofollow
    env = {"NUMARUN_RUN_DIR": str(run_dir)}
    if kind is AppKind.TRAINER:
        config_file = run_dir / "config.yaml"
        write_text(config_file, text)
        write_text(run_dir / "overrides.yaml", _overrides_yaml(overrides))
        launcher = {k: _plain(cfg.launcher[k]) for k in LAUNCHER_KEYS}
        script_args: tuple[str, ...] = ()
    else:
        # written once here; every rank runs with hydra.output_subdir=null
        hydra_dir = run_dir / ".hydra"
        try:
            if write:
                os.mkdir(hydra_dir)
        except FileExistsError:
            if os.path.islink(hydra_dir) or not hydra_dir.is_dir():
                raise ConfigError(f"bad run dir {str(hydra_dir)!r}: not a real directory; expected a new run dir") from None
        config_file = hydra_dir / "config.yaml"
        write_text(config_file, text)
        write_text(hydra_dir / "hydra.yaml", _hydra_yaml(cfg, run_dir))
        write_text(hydra_dir / "overrides.yaml", _overrides_yaml(overrides))
        launcher = {}
        script_args = tuple(overrides) + (f"hydra.run.dir={run_dir}", "hydra.output_subdir=null") + tuple(other)
    env["NUMARUN_CONFIG"] = str(config_file)
    log.info("job config saved in %s", run_dir)
    return PreparedJob(
        kind=kind,
        run_dir=run_dir,
        config_file=config_file,
        overrides=tuple(overrides),
        script_args=script_args,
        launcher=launcher,
        env=env,
    )


def _hydra_yaml(cfg: Any, run_dir: Path) -> str:
    """The ``hydra`` node as Hydra would save it, with the run dir every rank shares."""
    from omegaconf import OmegaConf, open_dict

    node = OmegaConf.create({"hydra": OmegaConf.to_container(cfg.hydra, resolve=False)})
    with open_dict(node):
        node.hydra.run.dir = str(run_dir)
        node.hydra.runtime.output_dir = str(run_dir)
    return OmegaConf.to_yaml(node)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


# ----------------------------------------------------------------------------- run command side

# torchrun/numarun option dest -> default, to tell "flag not given" (then the config's value wins)
_FLAG_DESTS = {
    "nproc_per_node": "nproc_per_node",
    "nnodes": "nnodes",
    "node_rank": "node_rank",
    "binding": "binding",
    "mem_policy": "mem_policy",
    "nic_policy": "nic_policy",
    "master_addr": "master_addr",
    "master_port": "master_port",
    "rdzv_endpoint": "rdzv_endpoint",
    "rdzv_id": "rdzv_id",
    "strict_binding": "strict_binding",
}


def apply_launcher_settings(args: Any, settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Copy the config's ``launcher`` values into ``args`` where the flag was left at its default.

    A flag given with its default value counts as not given (argparse cannot tell them apart).
    Returns the names set from the config.
    """
    from ..plan.options import parse_binding, parse_mem_policy, parse_nic_policy

    applied = []
    for key, dest in _FLAG_DESTS.items():
        value = settings.get(key)
        if value is None or not hasattr(args, dest):
            continue
        if getattr(args, dest) != defaults.get(dest):
            continue  # the user's flag wins
        if key == "binding":
            value = parse_binding(str(value))
        elif key == "mem_policy":
            value = parse_mem_policy(str(value))
        elif key == "nic_policy":
            value = parse_nic_policy(str(value))
        elif key == "nnodes":
            value = str(value)
        setattr(args, dest, value)
        applied.append(key)
    return applied
