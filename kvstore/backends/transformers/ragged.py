"""Rows of different contexts in one batch (problems in flight, kvstore.engine.protocol.RaggedRows).

Each context is prefilled (or grafted) on its own, in the backend's pinned schedule, exactly as one problem at a time
would; `join` then lays the caches side by side: every layer's keys and values are left-padded with zeros to the
longest row (end-aligned, so the newest key of every row sits at the same cache index) and a padding mask (0 for the
padded slots) goes with them. `step` feeds one token per row at the row's own position, with the mask extended by
the new slot; transformers builds each layer's mask from it (causal, sliding windows by cache index, which for an
end-aligned row is its own position plus a constant) and RoPE takes the per-row positions.

Sliding-window layers keep the last `window - 1` keys (transformers' DynamicSlidingWindowLayer): a row shorter than
that holds fewer, and is padded to the longest kept length; the layer's `cumulative_length` becomes the longest row's.

What a row's bits depend on: in the default mode the matrix products and attention see the whole batch, so a row
can differ from the same row decoded alone in its last bits (the harness records "rows depend on batch
composition"). With determinism.batch_invariant=true every product is tiled and the attention walks key blocks
aligned to each row's own absolute positions (kvstore/backends/transformers/invariant.py), padded and masked slots
adding exactly nothing: a row's bits are those of the row decoded alone (tests/harness/test_in_flight.py::
test_batch_invariant_rows_in_flight_equal_one_problem_at_a_time, prompts of different lengths joined).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvstore.backends.transformers.capture import new_cache
from kvstore.backends.transformers.model import FrozenModel, cache_kwargs
from kvstore.errors import KVStoreError


@dataclass
class JoinedRows:
    """A cache holding rows of different contexts, end-aligned, and its padding mask (rows, cached slots)."""

    cache: DynamicCache
    mask: torch.Tensor  # (rows, slots) long: 1 where a row has a token, 0 where it is padded


def join(fm: FrozenModel, caches: Sequence[DynamicCache]) -> JoinedRows:
    """One JoinedRows with every row of `caches` (in order), each left-padded to the longest."""
    if not caches:
        raise KVStoreError("join_rows: no states to join; give at least one")
    lengths = [int(c.get_seq_length()) for c in caches]
    rows = [int(_layers(c)[0].keys.shape[0]) for c in caches]
    if min(lengths) < 1:
        raise KVStoreError("join_rows: a state holds no tokens; prefill each context before joining")
    total = max(lengths)
    out = new_cache(fm)
    for i, layer in enumerate(_layers(out)):
        parts = [_layers(c)[i] for c in caches]
        kept = max(p.keys.shape[-2] for p in parts)
        keys = torch.cat([_left_pad(p.keys, kept) for p in parts])
        values = torch.cat([_left_pad(p.values, kept) for p in parts])
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = total
    mask = torch.zeros(sum(rows), total, dtype=torch.long, device=fm.device)
    r = 0
    for n, length in zip(rows, lengths, strict=True):
        mask[r : r + n, total - length :] = 1
        r += n
    return JoinedRows(out, mask)


def _layers(cache: DynamicCache) -> list:
    return list(cache.layers)


def _left_pad(t: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - t.shape[-2]
    if missing == 0:
        return t
    return torch.cat([t.new_zeros(*t.shape[:-2], missing, t.shape[-1]), t], dim=-2)


def step(fm: FrozenModel, joined: JoinedRows, tokens: list[int], positions: list[int]) -> torch.Tensor:
    """One token per row at its own position: the logits (rows, vocab); the cache and mask advance."""
    rows = joined.mask.shape[0]
    if len(tokens) != rows or len(positions) != rows:
        raise KVStoreError(f"step_rows: {len(tokens)} tokens and {len(positions)} positions for {rows} rows; give one "
                           "of each per row")
    device = fm.device
    joined.mask = torch.cat([joined.mask, joined.mask.new_ones(rows, 1)], dim=1)
    ids = torch.tensor([[t] for t in tokens], dtype=torch.long, device=device)
    pos = torch.tensor([[p] for p in positions], dtype=torch.long, device=device)
    out = fm.model(input_ids=ids, position_ids=pos, attention_mask=joined.mask,
                   **cache_kwargs(fm.model, joined.cache), use_cache=True)
    return out.logits[:, -1, :]


def keep(fm: FrozenModel, joined: JoinedRows, rows: list[int]) -> None:
    """Keep only `rows` (indices into the joined rows), cache and mask."""
    index = torch.tensor(rows, dtype=torch.long, device=fm.device)
    joined.cache.batch_select_indices(index)
    joined.mask = joined.mask[index]
