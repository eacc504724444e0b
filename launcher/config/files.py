"""Writing a trainer job's files into its run dir: the resolved ``config.yaml`` every rank reads.

Hydra itself writes ``.hydra/{config,hydra,overrides}.yaml`` (and ``multirun.yaml``); numarun
adds the resolved config (``${now:}``, ``${hydra:...}`` and every other interpolation
evaluated once, in the launcher) so that no rank composes or resolves again.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import envvars
from ..errors import ConfigError, first_line
from .rundir import write_text_nofollow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedJob:
    """One trainer job composed by the launcher, ready for ``numarun run``."""

    run_dir: Path
    config_file: Path
    """``<run dir>/config.yaml``: the resolved config every rank reads."""
    overrides: tuple[str, ...]
    launcher: Mapping[str, Any] = field(default_factory=dict)
    """Settings from the ``launcher`` group (plain str/int/bool; None = unset)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every worker."""
    config_text: str = ""
    """The resolved job config (YAML)."""
    config: Any = None
    """The same, checked and typed: a :class:`~numarun.config.schema.JobConfig` (an OmegaConf DictConfig)."""


def resolved_yaml(cfg: Any) -> str:
    """The job config (no ``hydra`` node) with every interpolation resolved; ConfigError otherwise."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    try:
        return OmegaConf.to_yaml(job, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(
            f"bad config value: {first_line(e)}; expected every ??? "
            "value given as an override and every interpolation resolvable"
        ) from None


def prepare_job(cfg: Any, run_dir: Path, overrides: list[str]) -> PreparedJob:
    """The job of ``cfg`` (Hydra's composed config, ``hydra.runtime.output_dir`` set), resolved and
    validated before Hydra makes its run dir; nothing is written (:func:`save_job`)."""
    from .schema import load_job_config_text

    text = resolved_yaml(cfg)
    checked = load_job_config_text(text, origin="composed config")  # value checks the types cannot express
    from ..options.launch import config_keys

    launcher = {k: plain(checked.launcher[k]) for k, _ in config_keys()}
    config_file = run_dir / "config.yaml"
    return PreparedJob(
        run_dir=run_dir,
        config_file=config_file,
        overrides=tuple(overrides),
        launcher=launcher,
        env={envvars.RUN_DIR: str(run_dir), envvars.CONFIG: str(config_file)},
        config_text=text,
        config=checked,
    )


def running_job(cfg: Any) -> PreparedJob:
    """The job Hydra's ``run_job`` is running, seen from its task (``cfg``: the job's config without ``hydra``)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    return prepare_job(cfg, Path(hydra.runtime.output_dir), [str(o) for o in hydra.overrides.task])


def save_job(job: PreparedJob) -> None:
    """Write the job's resolved config into its run dir (made by Hydra), never through a planted link."""
    write_text_nofollow(job.config_file, job.config_text)
    log.info("job config saved in %s", job.run_dir)


def plain(value: Any) -> Any:
    """A config value as the options read it (an Enum member as its value)."""
    return value.value if isinstance(value, enum.Enum) else value
