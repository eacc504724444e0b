"""Job configs: structured schema (``schema``) and one-time composition with Hydra (``compose``).

Only ``numarun.config.compose`` imports Hydra; workers read the saved config with
:func:`numarun.config.schema.load_job_config` (OmegaConf only).
"""

from __future__ import annotations
