"""Graft: rebuild a fresh transformers cache from a Snapshot so decoding continues as if the model had just
read the snapshot's tokens.

Own-position graft (the snapshot occupies the positions it was computed at) is exact: the rebuilt cache
holds the very tensors the fresh computation would. `reposition` moves keys to other positions by RoPE
composition; that is an experiment (scripts/position_sweep.py), not an exact operation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.capture import new_cache
from kvstore.errors import IncompatibleError
from kvstore.format import Snapshot
from kvstore.model import FrozenModel


def check_compatible(
    snapshot: Snapshot, fm: FrozenModel, token_ids: list[int] | None = None, position: int | None = None
) -> None:
    """Raise IncompatibleError naming the first thing that differs between the snapshot and this use of it."""
    name = snapshot.model_name or "artifact"
    if snapshot.model_fingerprint != fm.fingerprint:
        raise IncompatibleError(
            f"{name}: model fingerprint {snapshot.model_fingerprint[:12]} differs from the loaded model's "
            f"{fm.fingerprint[:12]} ({fm.name}); deposit it again with this model"
        )
    if snapshot.tokenizer_fingerprint != fm.tokenizer_fingerprint:
        raise IncompatibleError(
            f"{name}: tokenizer fingerprint {snapshot.tokenizer_fingerprint[:12]} differs from the loaded "
            f"tokenizer's {fm.tokenizer_fingerprint[:12]}; deposit it again with this tokenizer"
        )
    if snapshot.dtype != fm.determinism.dtype:
        raise IncompatibleError(
            f"{name}: artifact dtype {snapshot.dtype} differs from the model's {fm.determinism.dtype}"
        )
    if snapshot.layout != fm.layer_layout:
        raise IncompatibleError(
            f"{name}: layer layout differs (artifact {len(snapshot.layers)} layers "
            f"{_layout_str(snapshot.layout)}, model {len(fm.layer_layout)} layers {_layout_str(fm.layer_layout)})"
        )
    for i, lyr in enumerate(snapshot.layers):
        if str(lyr.keys.dtype).removeprefix("torch.") != snapshot.dtype:
            raise IncompatibleError(f"{name}: layer {i} keys are {lyr.keys.dtype}, metadata says {snapshot.dtype}")
    if position is not None and position != snapshot.start_position:
        raise IncompatibleError(
            f"{name}: graft at position {position}, but the artifact was computed at start position "
            f"{snapshot.start_position}; own position is the only exact graft (reposition=True to re-rotate)"
        )
    if token_ids is not None:
        n = snapshot.token_count
        if list(token_ids[:n]) != snapshot.token_ids:
            first = next(
                (i for i, (a, b) in enumerate(zip(token_ids, snapshot.token_ids)) if a != b), min(len(token_ids), n)
            )
            raise IncompatibleError(
                f"{name}: the context's token ids do not begin with the artifact's {n} tokens "
                f"(first difference at index {first}); graft only onto text that starts with the artifact's text"
            )


def _layout_str(layout: list[dict]) -> str:
    return "".join("S" if x["kind"] == "sliding" else "F" for x in layout)


def graft_snapshot(
    snapshot: Snapshot, fm: FrozenModel, token_ids: list[int] | None = None, position: int | None = None
) -> DynamicCache:
    """A fresh cache holding the snapshot's state at its own positions, after all compatibility checks.

    token_ids: the full context the caller will run (checked to begin with the snapshot's tokens).
    position: where the caller expects the snapshot to start (checked to equal its start position).
    """
    check_compatible(snapshot, fm, token_ids, position)
    if snapshot.start_position != 0:
        raise IncompatibleError(
            f"artifact starts at position {snapshot.start_position}; a fresh cache starts at 0. "
            "Graft a snapshot computed from position 0."
        )
    return _rebuild(snapshot, fm)


def _rebuild(snapshot: Snapshot, fm: FrozenModel, keys_override: list[torch.Tensor] | None = None) -> DynamicCache:
    cache = new_cache(fm)
    device = fm.device
    for i, (layer, lyr) in enumerate(zip(cache.layers, snapshot.layers)):
        k = (keys_override[i] if keys_override is not None else lyr.keys).to(device)
        v = lyr.values.to(device)
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = lyr.cumulative_length
    return cache


def rotate_keys(fm: FrozenModel, snapshot: Snapshot, offset: int) -> list[torch.Tensor]:
    """Keys moved by `offset` positions by RoPE composition: R(p + offset) k = R(offset) R(p) k.

    Uses the model's own rotary module per layer type (Gemma 3 has two bases). Not bit-exact for offset != 0:
    the composed rotation rounds differently from a rotation computed at p + offset.
    """
    model = fm.model
    base = getattr(model, "model", model)
    rotary = base.rotary_emb
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * len(snapshot.layers)
    out = []
    for lyr, t in zip(snapshot.layers, types):
        k = lyr.keys
        pos = torch.tensor([[offset]], device=k.device)
        try:
            cos, sin = rotary(k, pos, t)
        except TypeError:  # single-base models (Llama): forward(x, position_ids)
            cos, sin = rotary(k, pos)
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, 1, head_dim)
        half = k.shape[-1] // 2
        rot = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        out.append((k * cos + rot * sin).to(k.dtype))
    return out


def graft_repositioned(snapshot: Snapshot, fm: FrozenModel, offset: int) -> DynamicCache:
    """Experimental: a cache whose keys are re-rotated as if computed `offset` positions later.

    The caller must pass explicit positions (start + offset ...) to later forwards. Full-attention layouts, or
    sequences shorter than the sliding window, only: the sliding mask assumes cache index == position.
    """
    check_compatible(snapshot, fm)
    return _rebuild(snapshot, fm, rotate_keys(fm, snapshot, offset))
