"""Job configs: structured schema (``schema``) and one-time composition with Hydra (``compose``).

Only ``compose`` drives Hydra, and only ``numarun.hydra_internals`` touches Hydra's private parts;
workers read the saved config with :func:`numarun.config.schema.load_job_config` (OmegaConf
only). Nothing here imports the trainer or the commands above it.
"""
