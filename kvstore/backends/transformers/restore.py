"""Restore: rebuild a fresh transformers cache from a Snapshot that the backend has admitted, so decoding continues
as if the model had just read the snapshot's tokens (the backend's `graft`, kvstore/backends/transformers/backend.py,
runs the one admission first; graft.py is the engine's function face over it).

    check_layout(snapshot, fm, position)     the layer layout and shapes this model caches
    rebuild(snapshot, fm)                    a cache the model builds for itself, every layer filled from the snapshot
    rotate_keys(fm, snapshot, offset)        keys moved by RoPE composition (the position experiment; not exact)

Own-position graft (the snapshot occupies the positions it was computed at) is exact: the rebuilt cache holds the
very tensors the fresh computation would.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.backends.transformers.cache_state import fill_layer, layer_state, summary, uncaptured
from kvstore.backends.transformers.capture import new_cache
from kvstore.backends.transformers.model import FrozenModel, layout_string, stored_layout
from kvstore.errors import IncompatibleError
from kvstore.format.artifact import Snapshot


def model_kv_shape(fm: FrozenModel) -> tuple[int | None, int | None]:
    """(kv_heads, head_dim) every layer's cache has for this model, from its config (None where the config
    does not say; that dimension is then not checked)."""
    cfg = fm.config.get_text_config(decoder=True) if hasattr(fm.config, "get_text_config") else fm.config
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None)
    if not head_dim and heads and getattr(cfg, "hidden_size", None):
        head_dim = cfg.hidden_size // heads
    return (int(kv_heads) if kv_heads else None), (int(head_dim) if head_dim else None)


def check_layout(snapshot: Snapshot, fm: FrozenModel, position: int | None = None) -> None:
    """What is the transformers engine's own after the one admission: the layer layout, every layer's
    (kv_heads, head_dim), and the start position the caller expects (IncompatibleError naming the first)."""
    name = snapshot.model_name or "artifact"
    if snapshot.layout != stored_layout(fm.layer_layout):  # chunked layers are stored as sliding (FORMAT.md 9)
        raise IncompatibleError(
            f"{name}: layer layout differs (artifact {len(snapshot.layers)} layers "
            f"{layout_string(snapshot.layout)}, model {len(fm.layer_layout)} layers {layout_string(fm.layer_layout)})"
        )
    kv_heads, head_dim = model_kv_shape(fm)
    for i, lyr in enumerate(snapshot.layers):
        got = tuple(lyr.keys.shape)
        if (kv_heads and got[1] != kv_heads) or (head_dim and got[3] != head_dim):
            raise IncompatibleError(
                f"{name}: layer {i} keys/values have shape {got}, the model caches (1, {kv_heads}, tokens, {head_dim}) "
                "(batch, kv_heads, tokens, head_dim); deposit the artifact again with this model"
            )
    if position is not None and position != snapshot.start_position:
        raise IncompatibleError(
            f"{name}: graft at position {position}, but the artifact was computed at start position "
            f"{snapshot.start_position}; own position is the only exact graft (reposition=True to re-rotate)"
        )


def rebuild(snapshot: Snapshot, fm: FrozenModel, keys_override: list[torch.Tensor] | None = None) -> DynamicCache:
    """The cache the model builds for itself (capture.new_cache), every layer filled from the snapshot; refuses
    (IncompatibleError naming the layer) a layer class with state an artifact cannot fill (FORMAT.md section 9)."""
    cache = new_cache(fm)
    if len(cache.layers) != len(snapshot.layers):
        raise IncompatibleError(f"the model's cache has {len(cache.layers)} layers, the artifact "
                                f"{len(snapshot.layers)}; deposit it again with this model")
    device = fm.device
    for i, (layer, lyr) in enumerate(zip(cache.layers, snapshot.layers)):
        kind = fm.layer_layout[i]["kind"] if i < len(fm.layer_layout) else lyr.kind
        where = f"layer {i} ({kind}, {type(layer).__name__})"
        slots = uncaptured(layer_state(layer))
        if lyr.kind not in ("full", "sliding") or slots or not hasattr(layer, "lazy_initialization"):
            raise IncompatibleError(
                f"cannot graft {where}: the model's cache layer holds "
                f"{summary(slots) if slots else 'no keys/values of its own'}, which an artifact does not fill; "
                "kvgraft cannot graft into this model"
            )
        k = (keys_override[i] if keys_override is not None else lyr.keys).to(device)
        fill_layer(layer, k, lyr.values.to(device), lyr.cumulative_length)
        if getattr(layer, "is_sliding", False) != (lyr.kind == "sliding") or layer.keys is not k:
            raise IncompatibleError(f"cannot graft {where}: the rebuilt layer does not hold the artifact's "
                                    f"{lyr.kind} state; kvgraft cannot graft into this model")
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
