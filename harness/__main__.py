"""Hydra entry point: `python -m harness [overrides]` (`make aime-baseline`), `-m` for multirun sweeps.

Each job writes its run folder to Hydra's output dir, named as harness.record.folder.STAMP_FORMAT says and created
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
from omegaconf import DictConfig, OmegaConf

from harness.config.exact import ConfigFiles, print_note
from harness.config.exact import resolve as resolve_exact_default
from harness.config.schema import check_overrides, compose_config, typed
from harness.errors import ConfigError, debugging, exit_on_error
from harness.errors import plain as plain_text
from harness.record.folder import RunFolder, claim
from harness.run.loop import run
from kvstore import PROFILES, enter_profile, profile_problems

#: Free space a Hydra run needs before its job starts: Hydra writes .hydra/ and its log into the folder itself,
#: where a full disk would give its traceback instead of our one line.
HYDRA_MIN_FREE = 64 << 10


def _claim_dir(parent: str, name: str) -> str:
    """`${kvgraft.claim_dir:parent,name}`: parent/name created exclusively (parent/name-2 ... when taken). Cached
    per config (use_cache, copied into each sweep job by Hydra), so a sweep's jobs share their one sweep folder.
    Only Hydra's app runner resolves it: a read-only or full runs folder prints one `error:` line and exits 1
    there (an exception would reach the user as OmegaConf's 60-line interpolation traceback)."""
    import os
    import sys

    from harness.errors import HarnessError, StorageError, debugging, plain

    try:
        probe = Path(parent).absolute()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
        if st.f_bavail * st.f_frsize < HYDRA_MIN_FREE:
            raise StorageError(
                f"{parent}: no space left on the device (ENOSPC: {st.f_bavail * st.f_frsize >> 10} KiB free, a run "
                f"needs at least {HYDRA_MIN_FREE >> 10} KiB to start); free space there or point runs_dir= at "
                "another disk"
            )
        return str(claim(parent, name))
    except HarnessError as exc:
        if debugging():
            raise
        print(f"error: {plain(str(exc))}", file=sys.stderr)
        raise SystemExit(1) from None


OmegaConf.register_new_resolver("kvgraft.claim_dir", _claim_dir, use_cache=True, replace=True)


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
        # off where the mode cannot hold and the job did not ask for it; refused where it asked (config/exact.py)
        note = resolve_exact_default(cfg, list(hc.overrides.task), ConfigFiles.of_hydra(hc))
        if profile_problems(cfg.determinism.profile):
            _discard(out, multirun)  # enter_profile re-executes the command, which claims its own folder
        enter_profile(cfg.determinism.profile)  # re-executes with the profile's kernel variables when not set
        print_note(note)  # once, in the process that runs the job
        # a single run resumes an interrupted sibling with the same config; a sweep job keeps its own folder
        run(cfg, out, resume_from=None if multirun else out.parent, exact_default=note)
    except BaseException:
        _discard(out, multirun)  # a failed job leaves no empty folder (one with rows stays resumable)
        raise


def _check_command_line(args: list[str]) -> None:
    try:
        check_overrides(args)
        plain = [a for a in args if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
        if len(plain) == len(args) and not any("," in a or "(" in a for a in plain):  # a single run, no sweep
            # composed once here, so a mistyped value (model.llamacpp.threads=abc) or bad override syntax is one
            # line (issue 41, finding 7), not Hydra's 4-7
            typed(compose_config(plain))  # and checked (execution.workers=-1, ...) before Hydra makes a folder
    except ConfigError as exc:
        if debugging():
            raise
        print(f"error: {plain_text(str(exc))}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    _check_command_line(sys.argv[1:])
    for arg in sys.argv[1:]:  # re-execute before Hydra makes a run folder (main checks again for config files)
        name, _, value = arg.lstrip("+").partition("=")
        if name == "determinism.profile" and value in PROFILES:  # a sweep (a,b) is entered per job in main
            enter_profile(value)
    main()
