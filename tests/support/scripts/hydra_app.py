"""A user's own Hydra app, as users write them: run under numarun in the tests.

Each rank records what it saw (its config, Hydra's output dir, whether Hydra wrote
.hydra/ itself) in ``rank<RANK>.json`` inside the run dir.
"""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(config_path=".", config_name="hydra_app", version_base=None)
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out = hc.runtime.output_dir
    rank = os.environ.get("RANK", "0")
    record = {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "output_dir": out,
        "output_subdir": hc.output_subdir,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
