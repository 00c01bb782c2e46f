"""Hydra entry point: `python -m harness [overrides]` (`make aime-baseline`), `-m` for multirun sweeps.

Each job writes its run folder to Hydra's output dir, named as harness.run_folder.STAMP_FORMAT says and created
exclusively (configs/config.yaml's `kvgraft.claim_dir`): runs/<condition>/<stamp>/ (multirun:
runs/multirun/<stamp>[-N]/<job>_<condition>/, `-N` when another sweep took that second). A single run resumes
an interrupted run of the same config under runs/<condition>/ (its folder, not Hydra's new one, which is
removed; `run.fresh=true` starts over). A misspelt override is refused in one line with the near miss before
Hydra composes anything. The other entry points are `python -m harness.compare` (the main job) and
`python -m harness.library` (build a library); a harness error prints one `error:` line (KVGRAFT_DEBUG=1 or
HYDRA_FULL_ERROR=1 for the traceback), Ctrl-C / SIGTERM one `stopped:` line.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.config import check_overrides
from harness.errors import ConfigError, debugging, exit_on_error
from harness.run import run
from harness.run_folder import RunFolder
from kvstore.environment import PROFILES, enter_profile, profile_problems


def _discard(out: Path, multirun: bool) -> None:
    """Remove this job's folder when it holds no rows, and its sweep folder when nothing but multirun.yaml is left."""
    RunFolder(out).discard()
    sweep = out.parent
    if multirun and sweep.is_dir() and {p.name for p in sweep.iterdir()} <= {"multirun.yaml"}:
        shutil.rmtree(sweep, ignore_errors=True)


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    out, multirun = Path(hc.runtime.output_dir), hc.mode == RunMode.MULTIRUN
    try:
        if profile_problems(cfg.determinism.profile):
            _discard(out, multirun)  # enter_profile re-executes the command, which claims its own folder
        enter_profile(cfg.determinism.profile)  # re-executes with the profile's kernel variables when not set
        # a single run resumes an interrupted sibling with the same config; a sweep job keeps its own folder
        run(cfg, out, resume_from=None if multirun else out.parent)
    except BaseException:
        _discard(out, multirun)  # a failed job leaves no empty folder (one with rows stays resumable)
        raise


def _check_command_line(args: list[str]) -> None:
    try:
        check_overrides(args)
    except ConfigError as exc:
        if debugging():
            raise
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    _check_command_line(sys.argv[1:])
    for arg in sys.argv[1:]:  # re-execute before Hydra makes a run folder (main checks again for config files)
        name, _, value = arg.lstrip("+").partition("=")
        if name == "determinism.profile" and value in PROFILES:  # a sweep (a,b) is entered per job in main
            enter_profile(value)
    main()
