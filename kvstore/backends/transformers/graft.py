"""Graft, the transformers engine's function face: a fresh cache holding a Snapshot at its own positions, through the
transformers Backend that owns the model (kvstore/backends/transformers/backend.py: the one admission, then
restore.py's layout check and rebuild).

    cache = graft_snapshot(snapshot, be, token_ids=context)   # be: load_backend("transformers", ...), or a
                                                             # FrozenModel (its one Backend, TransformersBackend.of)

Own-position graft (the snapshot occupies the positions it was computed at) is exact: the rebuilt cache
holds the very tensors the fresh computation would. `graft_repositioned` moves keys to other positions by RoPE
composition; that is an experiment (scripts/position_sweep.py), not an exact operation.
"""

from __future__ import annotations

from transformers import DynamicCache

from kvstore.backends.transformers.backend import TransformersBackend
from kvstore.backends.transformers.model import FrozenModel
from kvstore.format.artifact import Snapshot


def check_compatible(
    snapshot: Snapshot,
    model: TransformersBackend | FrozenModel,
    token_ids: list[int] | None = None,
    position: int | None = None,
    allow_environment_mismatch: bool | None = None,
) -> None:
    """Raise IncompatibleError naming the first thing that breaks a format invariant or differs between the
    snapshot and this use of it (FORMAT.md section 5, in that order): the backend's `check`.

    allow_environment_mismatch: tolerate a different compute environment (the graft is then not guaranteed
    exact; a RuntimeWarning names the differences). None: the model's `determinism.allow_environment_mismatch`.
    """
    TransformersBackend.of(model).check(snapshot, token_ids, position, allow_environment_mismatch)


def graft_snapshot(
    snapshot: Snapshot,
    model: TransformersBackend | FrozenModel,
    token_ids: list[int] | None = None,
    position: int | None = None,
    allow_environment_mismatch: bool | None = None,
) -> DynamicCache:
    """A fresh cache holding the snapshot's state at its own positions, after all compatibility checks
    (every one raises a KVStoreError before any tensor reaches the model): the backend's `graft`.

    token_ids: the full context the caller will run (checked to begin with the snapshot's tokens).
    position: where the caller expects the snapshot to start (checked to equal its start position).
    allow_environment_mismatch: graft an artifact deposited in another compute environment anyway (not
        guaranteed exact); None takes the model's `determinism.allow_environment_mismatch` (default False).
    """
    return TransformersBackend.of(model).graft(snapshot, token_ids, position=position,
                                               allow_environment_mismatch=allow_environment_mismatch)


def graft_repositioned(snapshot: Snapshot, model: TransformersBackend | FrozenModel, offset: int) -> DynamicCache:
    """Experimental: a cache whose keys are re-rotated as if computed `offset` positions later.

    The caller must pass explicit positions (start + offset ...) to later forwards. Full-attention layouts, or
    sequences shorter than the sliding window, only: the sliding mask assumes cache index == position.
    """
    return TransformersBackend.of(model).graft_repositioned(snapshot, offset)
