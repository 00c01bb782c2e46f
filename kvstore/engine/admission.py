"""The one graft admission: before a byte of an artifact reaches any engine, compare every fact it recorded with the
backend that would take it, and refuse the first difference in one line naming it (kvstore/FORMAT.md section 5).

    admit(snapshot, backend, token_ids)     # raises IncompatibleError, or returns and the backend restores

In order: the backend that made it, the model fingerprint, the tokenizer fingerprint, the dtype, the pinned settings
(`settings_differences`: every field the backend's `settings()` and the artifact's `determinism` hold), the compute
environment (its opt-out: `allow_environment_mismatch`, which warns and marks the graft not guaranteed exact), the
format's own invariants, the vocabulary, and the token prefix. Every backend calls this from its `graft` and then
runs only what is its own: its layout check (layers, shapes, context size) and the restore.
"""

from __future__ import annotations

import warnings
from typing import Any

from kvstore.engine.protocol import Backend, artifact_backend
from kvstore.environment import environment_differences, numerics_differences, numerics_of_tags
from kvstore.errors import EnvironmentMismatchError, IncompatibleError, ValidationError
from kvstore.format.artifact import Snapshot, check_snapshot

#: Settings added to the format after artifacts had been written, with the value every earlier artifact ran under:
#: an artifact that does not record one is compared as if it had recorded this value (when the backend has it).
RECORDED_DEFAULTS: dict[str, Any] = {"profile": "native"}


def settings_differences(recorded: Any, current: dict[str, Any]) -> list[str]:
    """Each pinned setting that differs between an artifact's `determinism` and a backend's `settings()`, as
    "determinism.<field>: artifact X, this process Y" (empty when all agree). Types count: a recorded 1 is not the
    setting True. The one rule every backend's admission uses."""
    rec = dict(recorded) if isinstance(recorded, dict) else {}
    for key, value in RECORDED_DEFAULTS.items():
        if key in current:
            rec.setdefault(key, value)
    out = []
    for key in sorted(set(rec) | set(current)):
        a, b = rec.get(key, "<not recorded>"), current.get(key, "<not set>")
        if a != b or type(a) is not type(b):
            out.append(f"determinism.{key}: artifact {a!r}, this process {b!r}")
    return out


def artifact_differences(snapshot: Snapshot, backend: Backend) -> list[str]:
    """Every recorded setting and environment fact that differs, named (settings first)."""
    env = snapshot.environment if isinstance(snapshot.environment, dict) else {}
    return settings_differences(snapshot.determinism, backend.settings()) + environment_differences(
        env, backend.environment())


def admit(snapshot: Snapshot, backend: Backend, token_ids: list[int] | None = None, *,
          allow_environment_mismatch: bool = False) -> None:
    """Raise IncompatibleError naming the first recorded fact of `snapshot` that differs from `backend` (see the
    module docstring for the order); return when the artifact may be restored into it."""
    name = snapshot.model_name or "artifact"
    made_by = artifact_backend(snapshot)
    if made_by != backend.name:
        raise IncompatibleError(
            f"{name}: deposited by the {made_by} backend, this is the {backend.name} backend; an artifact grafts only "
            f"into the engine that made it: deposit it again with {backend.name} or load the model with the "
            f"{made_by} backend")
    if snapshot.model_fingerprint != backend.fingerprint:
        raise IncompatibleError(
            f"{name}: model fingerprint {snapshot.model_fingerprint[:12]} differs from the loaded model's "
            f"{backend.fingerprint[:12]} ({backend.model_name}); deposit it again with this model")
    if snapshot.tokenizer_fingerprint != backend.tokenizer_fingerprint:
        raise IncompatibleError(
            f"{name}: tokenizer fingerprint {snapshot.tokenizer_fingerprint[:12]} differs from the loaded "
            f"tokenizer's {backend.tokenizer_fingerprint[:12]}; deposit it again with this tokenizer")
    if snapshot.dtype != backend.dtype:
        raise IncompatibleError(
            f"{name}: artifact dtype {snapshot.dtype} differs from the model's {backend.dtype}; load the model with "
            f"dtype={snapshot.dtype} or deposit the artifact again")
    settings = settings_differences(snapshot.determinism, backend.settings())
    if settings:
        raise IncompatibleError(
            f"{name}: the artifact was computed under other settings than this process uses, so a graft would not "
            f"be byte-identical to the fresh reference: {'; '.join(settings)}. Load the model with the artifact's "
            "settings or deposit the artifact again under the current ones")
    env = environment_differences(snapshot.environment if isinstance(snapshot.environment, dict) else {},
                                  backend.environment())
    if env and not allow_environment_mismatch:
        raise EnvironmentMismatchError(
            f"{name}: the artifact was deposited in another compute environment, so a graft would not be "
            f"guaranteed byte-identical to the fresh reference: {'; '.join(env)}. Deposit it again here, or run "
            "where it was deposited, or graft anyway with allow_environment_mismatch=True, which marks the graft "
            "not guaranteed exact")
    if env:
        warnings.warn(f"{name}: grafted across compute environments (not guaranteed exact): {'; '.join(env)}",
                      RuntimeWarning, stacklevel=3)
    try:
        check_snapshot(snapshot)
    except ValidationError as e:  # a snapshot that breaks the format cannot match any model
        raise IncompatibleError(f"{e} (refused at graft, before any tensor reached the model)") from e
    vocab = backend.vocab_size()
    if vocab and snapshot.token_ids and max(snapshot.token_ids) >= vocab:
        raise IncompatibleError(f"{name}: token id {max(snapshot.token_ids)} is outside the model's vocabulary "
                                f"[0, {vocab}); deposit it again with this model's tokenizer")
    if token_ids is not None:
        n = snapshot.token_count
        if list(token_ids[:n]) != list(snapshot.token_ids):
            first = next((i for i, (a, b) in enumerate(zip(token_ids, snapshot.token_ids)) if a != b),
                         min(len(token_ids), n))
            raise IncompatibleError(
                f"{name}: the context's token ids do not begin with the artifact's {n} tokens (first difference at "
                f"index {first}); graft only onto text that starts with the artifact's text")


def backend_numerics(backend: Backend) -> str | None:
    """The backend's numerics fingerprint (kvstore.environment.numerics_fingerprint of its model's shapes in its
    settings), or None for a backend that does not measure one (llama.cpp, vLLM, the fake)."""
    measure = getattr(backend, "numerics", None)
    return measure() if callable(measure) else None


def check_numerics(tags: Any, backend: Backend, name: str = "artifact", *,
                   allow_environment_mismatch: bool = False) -> None:
    """Refuse (EnvironmentMismatchError naming both fingerprints) an artifact whose store tags record the numerics
    fingerprints it was deposited under (`numerics:<sha256>`) when this backend's is not among them: the
    environment records may agree, the bits do not. An artifact without the tag (deposited before it existed, or
    by a backend that measures none) is not compared on it. With `allow_environment_mismatch` it warns instead.

    The fingerprint is kept beside the artifact (a store tag), not in its bytes, so artifact ids, library
    identities and resume keys of the default path do not move (kvstore/FORMAT.md section 8)."""
    diffs = numerics_differences(numerics_of_tags(tags), backend_numerics(backend))
    if not diffs:
        return
    if not allow_environment_mismatch:
        raise EnvironmentMismatchError(
            f"{name}: the artifact was deposited on a machine whose kernels compute other bits, so a graft would not "
            f"be byte-identical to the fresh reference here: {diffs[0]}. Deposit it again on this machine, or graft "
            "anyway with allow_environment_mismatch=True, which marks the graft not guaranteed exact")
    warnings.warn(f"{name}: grafted across numerics (not guaranteed exact): {diffs[0]}", RuntimeWarning,
                  stacklevel=2)
