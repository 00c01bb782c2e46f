"""The exact default (issues 52, 58): `determinism.batch_invariant` is on unless a run says otherwise, wherever the
mode can hold (the transformers backend on the CPU in float32, on a machine where the mode's kernel runs), so a graft
equals a fresh one-pass computation of the whole prompt without a flag. Decided here, once, at composition.

Where the mode cannot hold (llama.cpp, vLLM, the fake; a GPU; bfloat16 or float16; a machine where the mode's kernel
cannot run: `kvstore.batch_invariant_unavailable`, asked only of a run that would run the mode) and the run did not
ask for it, the run goes on with the mode off and the entry point prints one line saying why and how to ask for it
(`resolve` returns it; each entry point prints it once, after its profile re-execution: harness/__main__.py, the
compare job, the library build). A run that asks for the mode there is refused in one line, on every backend: it
asks on the command line (`determinism.batch_invariant=true`) or in a config file it names that sets it (an
experiment file, a group option, its primary config: `asking_file`).

Runs, libraries and artifacts made before the flip keep their keys: the setting is recorded only when true, and
absent means false (harness.config.identity.RECORDED_ABSENT; kvstore.Determinism.to_dict). Such a run resumes, and
such a library is reused, with `determinism.batch_invariant=false` (its own setting) given on the command line.

    note = resolve(cfg, overrides, files)   # after composition: the default set off where the mode cannot hold,
                                            # and the line to print; or None. A ConfigError where it was asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ConfigError
from kvstore import batch_invariant_refusal, batch_invariant_unavailable

#: The harness default of determinism.batch_invariant (issue 52: the mode, where the setup has it).
EXACT_DEFAULT = True
SETTING = "determinism.batch_invariant"
_PATH = ("determinism", "batch_invariant")


@dataclass(frozen=True)
class ConfigFiles:
    """The config files a composition read: the primary config's name, each group's chosen option (Hydra's
    `runtime.choices`) and the folders they were read from (its config sources on disk)."""

    primary: str = "config"
    choices: Mapping[str, str | None] = field(default_factory=dict)
    roots: Sequence[Path] = ()

    @classmethod
    def of_hydra(cls, hydra: Any) -> ConfigFiles:
        """From Hydra's own config node (HydraConfig.get(), or a composed config's `hydra` node)."""
        roots = [Path(str(s.path)) for s in hydra.runtime.config_sources  # the folders (not pkg:// or structured)
                 if s.path and str(s.schema) not in ("pkg", "structured") and Path(str(s.path)).is_dir()]
        return cls(str(hydra.job.config_name or "config"), dict(hydra.runtime.choices), roots)


def given(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether one of the command-line `overrides` sets `SETTING` (key=value, +key=, ++key=, ~key)."""
    return any(str(o).lstrip("+~").partition("=")[0].strip() == SETTING for o in overrides)


def asking_file(files: ConfigFiles) -> str | None:
    """The config file among those composed that sets `SETTING` (the first, as a path), or None. A group option's file
    writes under its package (the group, unless its `# @package` header says otherwise: `_global_` is the root), so
    only a file whose package reaches `determinism` can set it."""
    named = [("", files.primary)] + [(g, o) for g, o in files.choices.items() if o and not g.startswith("hydra")]
    for group, option in named:
        for root in files.roots:
            path = root / group / f"{option}.yaml"
            if path.is_file():
                if _sets_setting(path, group):
                    return str(path)
                break
    return None


def _sets_setting(path: Path, group: str) -> bool:
    import yaml

    text = path.read_text(encoding="utf-8")
    package = group.replace("/", ".")
    for line in text.splitlines():
        if line.startswith("# @package"):
            package = line.removeprefix("# @package").strip()
            break
        if line.strip() and not line.startswith("#"):
            break
    package = {"_global_": "", "_group_": group.replace("/", ".")}.get(package, package)
    prefix = tuple(p for p in package.split(".") if p)
    if prefix != _PATH[:len(prefix)]:
        return False
    try:
        node: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return False  # Hydra has read it already: a file it could not read never reaches here
    for part in _PATH[len(prefix):]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def mode_missing(backend: str, device: str, dtype: str) -> str | None:
    """Why a run on `backend`, `device`, `dtype` has no batch-invariant mode, in a few words; None where it has."""
    if batch_invariant_refusal(str(backend)):
        return f"the {backend} backend has no batch-invariant mode"
    if str(device).split(":")[0] != "cpu":
        return f"model.device={device}: the mode is built and measured for the CPU"
    if str(dtype) != "float32":
        return f"determinism.dtype={dtype}: the mode is measured for float32 only"
    return None


def cannot_hold(backend: str, device: str, dtype: str) -> str | None:
    """Why the mode cannot hold for this setup on this machine: `mode_missing`, else what the backend's kernel says of
    this machine (`kvstore.batch_invariant_unavailable`, asked only here, when the rest has the mode); None: it can."""
    return mode_missing(backend, device, dtype) or batch_invariant_unavailable(str(backend))


def resolve(cfg: Any, overrides: list[str] | tuple[str, ...], files: ConfigFiles | None = None) -> str | None:
    """Decide the mode of the composed `cfg` (a DictConfig, changed in place) where it is on and cannot hold
    (`cannot_hold`): asked for (on the command line, or by a config file it names: `asking_file` over `files`), a
    ConfigError in one line; not asked for, set off, and the one line the entry point prints is returned. None where
    nothing changed (the mode holds, or it is off)."""
    det, model = cfg.get("determinism"), cfg.get("model")
    if det is None or model is None or det.get("batch_invariant") is not True:
        return None
    backend = str(model.get("backend", "transformers"))
    why = cannot_hold(backend, model.get("device", "cpu"), det.get("dtype", "float32"))
    if why is None:
        return None
    where = "on the command line" if given(overrides) else None
    if where is None and files is not None:
        found = asking_file(files)
        where = f"by the config file {found}" if found else None
    if where is not None:
        refusal = batch_invariant_refusal(backend)
        if refusal:
            raise ConfigError(f"{refusal} (asked for {where})")
        raise ConfigError(f"{SETTING}=true (asked for {where}): {why}, so the mode cannot hold here; leave it off "
                          f"({SETTING}=false)")
    det.batch_invariant = False
    return (f"note: {SETTING}=false for this run: {why} (the exact default holds for transformers on the CPU in "
            f"float32 where the mode's kernel runs; {SETTING}=true asks for it, and is refused where it cannot hold; "
            "docs/exactness.md)")


def print_note(note: str | None) -> None:
    """Print the exact default's one line (`resolve`) where the user sees it: stderr, beside the run's output."""
    import sys

    if note:
        print(note, file=sys.stderr, flush=True)
