"""Hydra entry point: `python -m harness [overrides]` (`make aime-baseline`), `-m` for multirun sweeps.

Each job writes its run folder to Hydra's output dir, named as harness.run_folder.STAMP_FORMAT says:
runs/<condition>/<stamp>/ (multirun: runs/multirun/<stamp>/<job>_<condition>/). The other entry points are
`python -m harness.compare` (the main job) and `python -m harness.library` (build a library); a harness
error prints one `error:` line (KVGRAFT_DEBUG=1 or HYDRA_FULL_ERROR=1 for the traceback).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness import config as _config  # noqa: F401  (registers the typed schema)
from harness.errors import exit_on_error
from harness.run import run
from kvstore.environment import PROFILES, enter_profile


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> None:
    enter_profile(cfg.determinism.profile)  # re-executes with the profile's kernel variables when not set
    run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    for arg in sys.argv[1:]:  # re-execute before Hydra makes a run folder (main checks again for config files)
        name, _, value = arg.lstrip("+").partition("=")
        if name == "determinism.profile" and value in PROFILES:  # a sweep (a,b) is entered per job in main
            enter_profile(value)
    main()
