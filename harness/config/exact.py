"""The exact default (issue 52): `determinism.batch_invariant` is on unless a run says otherwise, wherever kvgraft has
the mode (the transformers backend on the CPU in float32), so a graft equals a fresh one-pass computation of the
whole prompt without a flag.

Where the run's engine, device or dtype has no batch-invariant mode (llama.cpp, vLLM, the fake; a GPU; bfloat16 or
float16), the default is what it was before: off. That holds only while the setting was not given: a run that asks
for the mode there (`determinism.batch_invariant=true` on the command line or in a config file it names) is refused
in one line, as before, by the schema's checks (harness.config.schema.validate).

Runs, libraries and artifacts made before the flip keep their keys: the setting is recorded only when true, and
absent means false (harness.config.identity.RECORDED_ABSENT; kvstore.Determinism.to_dict). Such a run resumes, and
such a library is reused, with `determinism.batch_invariant=false` (its own setting) given on the command line.

    resolve(cfg, overrides)   # after composition: the default set off where the setup has no mode; why, or None
"""

from __future__ import annotations

from typing import Any

from kvstore import batch_invariant_refusal

#: The harness default of determinism.batch_invariant (issue 52: the mode, where the setup has it).
EXACT_DEFAULT = True
SETTING = "determinism.batch_invariant"


def given(overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether one of the command-line `overrides` sets `SETTING` (key=value, +key=, ++key=, ~key)."""
    return any(str(o).lstrip("+~").partition("=")[0].strip() == SETTING for o in overrides)


def mode_missing(backend: str, device: str, dtype: str) -> str | None:
    """Why a run on `backend`, `device`, `dtype` has no batch-invariant mode, in a few words; None where it has."""
    if batch_invariant_refusal(str(backend)):
        return f"the {backend} backend has no batch-invariant mode"
    if str(device).split(":")[0] != "cpu":
        return f"model.device={device}: the mode is built and measured for the CPU"
    if str(dtype) != "float32":
        return f"determinism.dtype={dtype}: the mode is measured for float32 only"
    return None


def resolve(cfg: Any, overrides: list[str] | tuple[str, ...]) -> str | None:
    """Set `SETTING` off in the composed `cfg` (a DictConfig, changed in place) where it holds the default and the
    setup has no mode (`mode_missing`), and return why in one line; None where nothing changed (the mode is there,
    the setting was given on the command line, or it is already off)."""
    det, model = cfg.get("determinism"), cfg.get("model")
    if det is None or model is None or given(overrides) or det.get("batch_invariant") is not EXACT_DEFAULT:
        return None
    why = mode_missing(model.get("backend", "transformers"), model.get("device", "cpu"), det.get("dtype", "float32"))
    if why is None:
        return None
    det.batch_invariant = False
    return (f"{SETTING}=false for this run: {why} (the exact default is on for transformers on the CPU in float32; "
            "docs/exactness.md)")
