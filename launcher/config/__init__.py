"""Job configs: structured schema (``schema``) and one-time composition with Hydra (``compose``).

Only ``launcher.config.compose`` imports Hydra; workers read the saved config with
:func:`launcher.config.schema.load_job_config` (OmegaConf only).
"""

from __future__ import annotations
