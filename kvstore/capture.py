"""Prefill a token sequence under the pinned schedule and capture the resulting cache as a Snapshot.

`prefill` is the one place a prefix is computed, so a deposit and a fresh reference run the same schedule
(chunks of `determinism.prefill_chunk` tokens). `capture_snapshot` reads every layer's keys/values exactly as the
transformers cache holds them: sliding-window layers keep only their last `window - 1` positions plus
`cumulative_length` (see transformers' DynamicSlidingWindowLayer).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.errors import IncompatibleError
from kvstore.format import LayerKV, Snapshot
from kvstore.model import FrozenModel, environment_fingerprint


def new_cache(fm: FrozenModel) -> DynamicCache:
    """An empty cache laid out for the model (sliding-window layers where the config has them)."""
    return DynamicCache(config=fm.model.config)


def forward(
    fm: FrozenModel, token_ids: list[int], cache: DynamicCache, position: int | None = None, logits_to_keep: int = 0
) -> torch.Tensor:
    """One forward pass of `token_ids` on top of `cache`; returns the logits (1, len, vocab).

    position: absolute position of the first token (default: what the cache has seen).
    logits_to_keep: compute logits for only the last N positions (0 = all); the cache is the same either way.
    """
    ids = torch.tensor([token_ids], dtype=torch.long, device=fm.device)
    start = cache.get_seq_length() if position is None else position
    pos = torch.arange(start, start + len(token_ids), device=fm.device).unsqueeze(0)
    out = fm.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return out.logits


def prefill(
    fm: FrozenModel, token_ids: list[int], cache: DynamicCache | None = None, position: int | None = None
) -> tuple[DynamicCache, torch.Tensor]:
    """Compute `token_ids` into `cache` (a new one by default) in the pinned chunk schedule.

    Returns the cache and the logits of the last token (1, vocab).
    """
    if not token_ids:
        raise IncompatibleError("prefill needs at least one token")
    cache = cache if cache is not None else new_cache(fm)
    start = cache.get_seq_length() if position is None else position
    chunk = fm.determinism.prefill_chunk or len(token_ids)
    logits = None
    for i in range(0, len(token_ids), chunk):
        logits = forward(fm, token_ids[i : i + chunk], cache, position=start + i, logits_to_keep=1)[:, -1, :]
    return cache, logits


def capture_snapshot(
    fm: FrozenModel, cache: DynamicCache, token_ids: list[int], start_position: int = 0, extra: dict | None = None
) -> Snapshot:
    """Turn a cache that has seen exactly `token_ids` (from `start_position`) into a Snapshot."""
    if len(cache.layers) != len(fm.layer_layout):
        raise IncompatibleError(f"cache has {len(cache.layers)} layers, model has {len(fm.layer_layout)}")
    layers = []
    for i, (layer, spec) in enumerate(zip(cache.layers, fm.layer_layout)):
        sliding = bool(getattr(layer, "is_sliding", False))
        if sliding != (spec["kind"] == "sliding"):
            raise IncompatibleError(
                f"cache layer {i} is {'sliding' if sliding else 'full'}, config says {spec['kind']}"
            )
        seen = layer.get_seq_length()
        if seen != len(token_ids):
            raise IncompatibleError(
                f"cache layer {i} has seen {seen} tokens, but {len(token_ids)} token ids were given"
            )
        cum = layer.cumulative_length if sliding else layer.keys.shape[-2]
        layers.append(LayerKV(spec["kind"], spec["window"], int(cum), layer.keys, layer.values))
    return Snapshot(
        token_ids=list(token_ids),
        start_position=start_position,
        layers=layers,
        model_fingerprint=fm.fingerprint,
        tokenizer_fingerprint=fm.tokenizer_fingerprint,
        dtype=fm.determinism.dtype,
        determinism=fm.determinism.to_dict(),
        environment=environment_fingerprint(fm.device),
        model_name=fm.name,
        extra=dict(extra or {}),
    )


def deposit_tokens(fm: FrozenModel, token_ids: list[int], extra: dict | None = None) -> Snapshot:
    """Prefill `token_ids` from position 0 and capture the cache: the artifact of that sequence."""
    cache, _ = prefill(fm, token_ids)
    return capture_snapshot(fm, cache, token_ids, 0, extra)
