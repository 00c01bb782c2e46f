"""Prefill a token sequence under the pinned schedule and capture the resulting cache as a Snapshot.

`prefill` is the one place a prefix is computed, so a deposit and a fresh reference run the same schedule
(chunks of `determinism.prefill_chunk` tokens). `capture_snapshot` reads every layer's keys/values exactly as the
transformers cache holds them: sliding-window layers keep only their last `window - 1` positions plus
`cumulative_length` (see transformers' DynamicSlidingWindowLayer).

Capture is complete or it refuses (FORMAT.md section 9): before a snapshot is made, every layer object of the
cache is inspected (kvstore/backends/transformers/cache_state.py) and any state the prefix left that is not keys,
values or
`cumulative_length` is a CaptureError naming the layer, its kind and what cannot be captured; then a cache is
rebuilt from the captured tensors exactly as graft rebuilds it and must equal the original in every attribute,
bit for bit. No model is named: a layer class never seen before falls under the same rule.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from kvstore.backends.transformers.cache_state import fill_layer, prefix_state, state_differences, summary, uncaptured
from kvstore.backends.transformers.model import WINDOWED, FrozenModel, cache_kwargs, environment_fingerprint
from kvstore.errors import CaptureError, IncompatibleError
from kvstore.format.artifact import LayerKV, Snapshot
from kvstore.format.measured import issue

CAPTURABLE = ("full", "sliding", "chunked")  # layer kinds whose whole state is keys, values, cumulative_length


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
    start = seen_tokens(cache) if position is None else position
    pos = torch.arange(start, start + len(token_ids), device=fm.device).unsqueeze(0)
    out = fm.model(input_ids=ids, position_ids=pos, **cache_kwargs(fm.model, cache), use_cache=True,
                   logits_to_keep=logits_to_keep)
    return out.logits


def seen_tokens(cache: DynamicCache) -> int:
    """How many tokens the cache has seen, read from its first attention layer (a layer with keys/values).

    transformers' own `get_seq_length` raises AttributeError/ValueError on caches whose first layer holds no
    keys (shared or linear-attention layers); this reads the first layer that has them."""
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if torch.is_tensor(keys) and keys.dim() == 4:
            return int(layer.cumulative_length) if getattr(layer, "is_sliding", False) else int(keys.shape[-2])
        if getattr(layer, "is_initialized", False) is False and hasattr(layer, "get_seq_length"):
            return 0  # an attention layer that has seen nothing yet
    raise IncompatibleError(
        f"the cache ({', '.join(sorted({type(x).__name__ for x in cache.layers}))}) has no attention layer holding "
        "keys/values, so the tokens it has seen are unknown; pass the position of the first token explicitly"
    )


def prefill(
    fm: FrozenModel, token_ids: list[int], cache: DynamicCache | None = None, position: int | None = None
) -> tuple[DynamicCache, torch.Tensor]:
    """Compute `token_ids` into `cache` (a new one by default) in the pinned chunk schedule.

    Returns the cache and the logits of the last token (1, vocab).
    """
    if not token_ids:
        raise IncompatibleError("prefill needs at least one token")
    fresh = cache is None
    cache = cache if cache is not None else new_cache(fm)
    start = (0 if fresh else seen_tokens(cache)) if position is None else position
    chunk = fm.determinism.prefill_chunk or len(token_ids)
    logits = None
    for i in range(0, len(token_ids), chunk):
        logits = forward(fm, token_ids[i : i + chunk], cache, position=start + i, logits_to_keep=1)[:, -1, :]
    return cache, logits


def capture_snapshot(
    fm: FrozenModel, cache: DynamicCache, token_ids: list[int], start_position: int = 0, extra: dict | None = None
) -> Snapshot:
    """Turn a cache that has seen exactly `token_ids` (from `start_position`) into a Snapshot.

    Raises CaptureError (a KVStoreError) when the cache holds state the snapshot cannot hold (module docstring)."""
    layers = capture_layers(fm, cache, len(token_ids))
    snapshot = Snapshot(
        token_ids=list(token_ids),
        start_position=start_position,
        layers=layers,
        model_fingerprint=fm.fingerprint,
        tokenizer_fingerprint=fm.tokenizer_fingerprint,
        dtype=fm.determinism.dtype,
        determinism=fm.recorded_settings(),
        environment=environment_fingerprint(fm.device),
        model_name=fm.name,
        extra=dict(extra or {}),
    )
    # the evidence of its numerics: measured by this process, which computed it, bound to these bytes (a put records
    # it as a tag; the one issuer of a measured record: kvstore/format/measured.py, issue 61)
    snapshot.numerics = issue(fm.numerics_sha256, snapshot, "measured by the process that computed it")
    return snapshot


def capture_layers(fm: FrozenModel, cache: DynamicCache, token_count: int) -> list[LayerKV]:
    """The artifact layers of a cache that has seen `token_count` tokens, after the capture-completeness checks:
    every layer's prefix state is keys/values (+ bookkeeping), and a cache rebuilt from them equals `cache`."""
    layout = fm.layer_layout
    if len(cache.layers) != len(layout):
        raise CaptureError(f"the cache has {len(cache.layers)} layers, the model's layer layout {len(layout)}; "
                           "kvgraft cannot map this cache onto the model's layers")
    fresh = new_cache(fm)
    if [type(x) for x in fresh.layers] != [type(x) for x in cache.layers]:
        i = next(i for i, (a, b) in enumerate(zip(fresh.layers, cache.layers)) if type(a) is not type(b))
        raise CaptureError(f"cache layer {i} is a {type(cache.layers[i]).__name__}, but the cache the model builds "
                           f"for itself has a {type(fresh.layers[i]).__name__} there; deposit from a cache made by "
                           "kvstore.backends.transformers.new_cache / prefill")
    layers = [_capture_layer(i, layer, fresh.layers[i], layout[i], token_count)
              for i, layer in enumerate(cache.layers)]
    _check_rebuild(fm, cache, layers)
    return layers


def _where(i: int, spec: dict, layer: object) -> str:
    return f"layer {i} ({spec['kind']}, {type(layer).__name__})"


def _capture_layer(i: int, layer: object, fresh: object, spec: dict, token_count: int) -> LayerKV:
    kind = spec["kind"]
    held = prefix_state(layer, fresh)
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not (torch.is_tensor(keys) and torch.is_tensor(values)):
        what = summary(uncaptured(held))
        if kind == "shared" or not what:
            reads = " (its attention reads another layer's)" if kind == "shared" else ""
            raise CaptureError(
                f"cannot capture {_where(i, spec, layer)}: it holds no keys/values of its own{reads}, and an "
                "artifact holds keys and values for every layer (it has no entry for such a layer), so kvgraft "
                "cannot deposit this model"
            )
        raise CaptureError(
            f"cannot capture {_where(i, spec, layer)}: it holds {what} for the prefix and no keys/values; an artifact "
            "holds keys, values and cumulative_length only (a graft would continue from a wrong state), so kvgraft "
            "cannot deposit this model"
        )
    if keys.shape[:-1] != values.shape[:-1] or keys.dim() != 4 or keys.shape[-1] != values.shape[-1]:
        raise CaptureError(
            f"cannot capture {_where(i, spec, layer)}: its cache holds keys {tuple(keys.shape)} and values "
            f"{tuple(values.shape)} of different shapes (a compressed latent, e.g. MLA); an artifact holds keys and "
            "values of one shape (batch, kv_heads, tokens, head_dim) per layer, so kvgraft cannot deposit this model"
        )
    extra = uncaptured(held)
    if extra:
        raise CaptureError(
            f"cannot capture {_where(i, spec, layer)}: besides keys and values its cache holds {summary(extra)} "
            "for the prefix, which an artifact does not hold (a graft would continue from a wrong state); kvgraft "
            "cannot deposit this model"
        )
    if kind not in CAPTURABLE:
        raise CaptureError(f"cannot capture {_where(i, spec, layer)}: kvgraft captures {', '.join(CAPTURABLE)} "
                           "layers only")
    sliding = bool(getattr(layer, "is_sliding", False))
    if sliding != (kind in WINDOWED):
        raise CaptureError(f"cannot capture {_where(i, spec, layer)}: the cache layer is "
                           f"{'windowed' if sliding else 'not windowed'}, the layer layout says {kind}")
    seen = int(layer.cumulative_length) if sliding else int(keys.shape[-2])
    if seen != token_count:
        raise IncompatibleError(f"cache layer {i} has seen {seen} tokens, but {token_count} token ids were given")
    return LayerKV("full" if kind == "full" else "sliding", spec["window"], seen, keys, values)  # stored kind


def _check_rebuild(fm: FrozenModel, cache: DynamicCache, layers: list[LayerKV]) -> None:
    """Rebuild a cache from `layers` as graft does and require every attribute of every layer to equal the
    original's, bit for bit: whatever the checks above did not name, this catches."""
    rebuilt = new_cache(fm)
    for i, (layer, lyr) in enumerate(zip(rebuilt.layers, layers)):
        if not hasattr(layer, "lazy_initialization"):
            raise CaptureError(f"cannot capture {_where(i, fm.layer_layout[i], layer)}: the model's cache layer "
                               "cannot be filled from keys and values; kvgraft cannot deposit this model")
        fill_layer(layer, lyr.keys, lyr.values, lyr.cumulative_length)
        diffs = state_differences(cache.layers[i], layer)
        if diffs:
            raise CaptureError(
                f"cannot capture {_where(i, fm.layer_layout[i], layer)}: a cache rebuilt from its keys and values "
                f"differs from the model's in {'; '.join(diffs[:3])} (original vs rebuilt); kvgraft cannot deposit "
                "this model"
            )
