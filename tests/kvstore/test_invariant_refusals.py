"""Issue 51, item 6: the batch-invariant attention refuses what it used to assume. Without position_ids it took key
0 as position 0 (wrong block alignment once a sliding window dropped keys, or for a cache grafted elsewhere); with no
mask on a sliding-window layer it attended past the window; and nothing confirmed at run time that attention went
through the invariant path at all (a model whose attention implementation was switched back ran the fused kernel,
silently not batch-invariant). Each is now one KVStoreError line."""

from __future__ import annotations

import pytest
import torch

from kvstore import Determinism, KVStoreError
from kvstore.backends.transformers.capture import forward, new_cache
from kvstore.backends.transformers.invariant import invariant_attention
from kvstore.backends.transformers.model import load_frozen_model

INVARIANT = Determinism(batch_invariant=True, prefill_chunk=0)
IDS = [2] + [4 + (53 * i + 17) % 256 for i in range(20)]


@pytest.fixture(scope="module")
def fm():
    return load_frozen_model("tiny-gemma3", INVARIANT)


def _qkv(q: int = 3, kv: int = 10):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, q, 8, generator=g), torch.randn(1, 2, kv, 8, generator=g),
            torch.randn(1, 2, kv, 8, generator=g))


class _Layer(torch.nn.Module):
    def __init__(self, window: int | None) -> None:
        super().__init__()
        self.sliding_window = window
        self.layer_idx = 0


def test_attention_without_position_ids_is_refused_not_assumed():
    q, k, v = _qkv()
    with pytest.raises(KVStoreError, match="position_ids none.*not assumed"):
        invariant_attention(_Layer(None), q, k, v, None)
    with pytest.raises(KVStoreError, match=r"position_ids shape \(1, 2\)"):
        invariant_attention(_Layer(None), q, k, v, None, position_ids=torch.tensor([[8, 9]]))
    out, _ = invariant_attention(_Layer(None), q, k, v, None, position_ids=torch.tensor([[7, 8, 9]]))
    assert out.shape == (1, 3, 4, 8)


def test_more_keys_than_positions_is_refused():
    q, k, v = _qkv()
    with pytest.raises(KVStoreError, match="10 keys but the last query is at position 4"):
        invariant_attention(_Layer(None), q, k, v, None, position_ids=torch.tensor([[2, 3, 4]]))


def test_a_sliding_layer_without_a_mask_is_refused():
    q, k, v = _qkv()
    with pytest.raises(KVStoreError, match="no attention mask on a sliding-window layer"):
        invariant_attention(_Layer(4), q, k, v, None, position_ids=torch.tensor([[7, 8, 9]]))


def test_every_forward_is_confirmed_to_have_gone_through_the_invariant_attention(fm):
    forward(fm, IDS, new_cache(fm))  # the mode as installed: every layer's attention went through it
    fm.model.set_attn_implementation("sdpa")  # switched back behind the mode's back
    try:
        with pytest.raises(KVStoreError, match="ran 0 attention call.*sdpa"):
            forward(fm, IDS, new_cache(fm))
    finally:
        from kvstore.backends.transformers.invariant import ATTENTION

        fm.model.set_attn_implementation(ATTENTION)
    forward(fm, IDS, new_cache(fm))


def _skewed(orig, when):
    """`orig` with a one-ulp-scale change where `when(args)` holds: a kernel path with other bits at some shape."""
    def call(*args, **kwargs):
        out = orig(*args, **kwargs)
        return out + 1e-6 if when(args) else out
    return call


@pytest.mark.parametrize("target, when, says", [
    ("linear", lambda a: a[0].shape[0] == 8, "other bits at 8 rows than among 64"),
    ("linear", lambda a: a[0].shape[0] == 4 and torch.get_num_threads() == 1, "other bits on one thread"),
    ("mm", lambda a: a[1].shape[1] == 4, "the LM head's rows"),
])
def test_a_machine_whose_kernels_move_a_rows_bits_is_refused_at_load(monkeypatch, target, when, says):
    """Issue 52: the row-tile property is checked at load on the model's own weights (check_tiles), not assumed: a
    BLAS that gives a row other bits at another row count, on one thread, or in the LM head's narrow product is
    refused in one line before anything is computed in the mode."""
    from kvstore import SettingsError

    module = torch.nn.functional if target == "linear" else torch
    monkeypatch.setattr(module, target, _skewed(getattr(module, target), when))
    with pytest.raises(SettingsError, match=says) as e:
        load_frozen_model("tiny-gemma3", INVARIANT)
    assert "\n" not in str(e.value) and "leave determinism.batch_invariant off" in str(e.value)
