"""What a transformers cache layer holds for a prefix, and whether an artifact holds all of it.

The artifact keeps, per layer, keys, values and `cumulative_length` (FORMAT.md section 9, the capture-completeness
rule). A cache layer may hold more: recurrent and convolution state (state-space and linear-attention layers),
nothing at all (layers that read another layer's keys/values), indexer keys, quantized copies, or a compressed
latent whose "keys" and "values" differ in width. None of that is told by the model's name, so the rule reads
the layer objects themselves:

    layer_state(layer)            every attribute, flattened ("conv_states[0]" -> tensor, "cumulative_length" -> 21)
    prefix_state(layer, fresh)    what the prefix put there: the attributes that differ from a layer that saw nothing
    state_differences(a, b)       the attributes where two layers differ (tensors compared bit for bit)
    fill_layer(layer, kv, cum)    the one place that writes an artifact's state into a fresh layer

Capture (kvstore/backends/transformers/capture.py) refuses a layer whose prefix state is not all
keys/values/bookkeeping and then
rebuilds the cache from what it captured and requires `state_differences` to be empty; graft
(kvstore/backends/transformers/graft.py)
requires the rebuilt layer to have no state slot the artifact cannot fill.
"""

from __future__ import annotations

import torch

# What an artifact restores: the tensors and the count it records, plus bookkeeping a layer derives from its
# constructor arguments (the window) or from the first tensors written (`lazy_initialization`: device, dtype).
CAPTURED = frozenset({"keys", "values", "cumulative_length"})
BOOKKEEPING = frozenset({"is_initialized", "device", "dtype", "sliding_window", "_sliding_window_tensor",
                         "record_past"})
_MAX_DEPTH = 4


def layer_state(layer: object) -> dict[str, object]:
    """Every attribute of a cache layer, flattened through dicts, lists and tuples, in sorted order:
    {"keys": tensor, "conv_states[0]": tensor, "has_previous_state[0]": True, ...}."""
    out: dict[str, object] = {}
    for name in sorted(vars(layer)):
        _flatten(name, vars(layer)[name], out, 0)
    return out


def _flatten(path: str, value: object, out: dict[str, object], depth: int) -> None:
    if isinstance(value, dict) and depth < _MAX_DEPTH:
        for k in sorted(value, key=repr):
            _flatten(f"{path}[{k!r}]" if isinstance(k, str) else f"{path}[{k}]", value[k], out, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < _MAX_DEPTH:
        for i, v in enumerate(value):
            _flatten(f"{path}[{i}]", v, out, depth + 1)
        if not value:
            out[path] = type(value)()
    else:
        out[path] = value


def same(a: object, b: object) -> bool:
    """Equal values; tensors equal in dtype, shape and every byte (so -0.0 != 0.0 and NaN == the same NaN)."""
    if torch.is_tensor(a) or torch.is_tensor(b):
        if not (torch.is_tensor(a) and torch.is_tensor(b)):
            return False
        if a is b:
            return True
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if a.numel() == 0:
            return True
        return bool(torch.equal(_bits(a), _bits(b)))
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an object without a usable ==: compare identity
        return a is b


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.dtype.is_floating_point or t.is_complex() else t


def describe(value: object) -> str:
    """A value in a few words: `tensor (1, 64, 4) float32`, or its repr."""
    if torch.is_tensor(value):
        return f"tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def prefix_state(layer: object, fresh: object) -> dict[str, object]:
    """The attributes of `layer` (a layer that has seen a prefix) that differ from `fresh` (a layer of the same
    cache built for the same model that has seen nothing): the state the prefix left."""
    before = layer_state(fresh)
    return {k: v for k, v in layer_state(layer).items() if k not in before or not same(v, before[k])}


def uncaptured(state: dict[str, object]) -> dict[str, object]:
    """The entries of a layer's (prefix) state that an artifact does not hold."""
    return {k: v for k, v in state.items() if _root(k) not in CAPTURED | BOOKKEEPING}


def _root(path: str) -> str:
    return path.split("[", 1)[0]


def state_differences(a: object, b: object) -> list[str]:
    """Each attribute where layers `a` and `b` differ, as "name: A vs B" (empty when every bit agrees)."""
    sa, sb = layer_state(a), layer_state(b)
    out = []
    for k in sorted(set(sa) | set(sb)):
        if k not in sa or k not in sb or not same(sa[k], sb[k]):
            out.append(f"{k}: {describe(sa.get(k, '<absent>'))} vs {describe(sb.get(k, '<absent>'))}")
    return out


def summary(state: dict[str, object], limit: int = 4) -> str:
    """`conv_states[0] (tensor (1, 64, 4) float32), recurrent_states[0] (...)`, at most `limit` entries."""
    order = sorted(state, key=lambda k: not torch.is_tensor(state[k]))  # tensors first, then the rest
    items = [f"{k} ({describe(state[k])})" for k in order]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def fill_layer(layer: object, keys: torch.Tensor, values: torch.Tensor, cumulative_length: int) -> None:
    """Write an artifact layer's state into a fresh cache layer, as the layer's own first update would."""
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    if getattr(layer, "is_sliding", False):
        layer.cumulative_length = cumulative_length
