"""Hydra entry point: `python -m harness [overrides]` (`make aime-baseline`), `-m` for multirun sweeps.

Each job writes its run folder to Hydra's output dir: runs/<condition>/<timestamp>/ (multirun:
runs/multirun/<timestamp>/<job>_<condition>/).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config as _config  # noqa: F401  (registers the typed schema)
from harness.run import run


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
