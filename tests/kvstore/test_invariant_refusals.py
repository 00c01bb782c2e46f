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
    """fixed.dot16 with a one-ulp-scale change where `when(x, isa_name, threads)` holds: a compiled kernel that
    departs from its scalar reference (a miscompile, a CPU that computes otherwise)."""
    def call(x, w, bias=None, *, isa_name=None, threads=None):
        out = orig(x, w, bias, isa_name=isa_name, threads=threads)
        return out + 1e-6 if when(x, isa_name, threads) else out
    return call


@pytest.mark.parametrize("when, says", [
    (lambda x, isa, t: isa != "scalar" and x.shape[0] == 1024, "at 1024 rows differs from the kernel's scalar"),
    (lambda x, isa, t: isa != "scalar" and t == 1 and x.shape[0] == 64, "differs between 1 and"),
    (lambda x, isa, t: isa != "scalar" and x.shape[0] == 67, "golden battery differs from its scalar reference"),
])
def test_a_kernel_that_departs_from_its_reference_is_refused_at_load(monkeypatch, when, says):
    """Issue 58: what the mode computes is measured at load (check_kernel): the compiled kernel against its scalar
    reference on a golden battery and on the model's own weights at 1 to 4,096 rows, on 1 thread and the process's.
    A kernel that departs anywhere is refused in one line before anything is computed in the mode, and
    `unavailable()` says the same line."""
    from kvstore import SettingsError
    from kvstore.backends.transformers import fixed, invariant

    if "between 1" in says and torch.get_num_threads() < 2:
        pytest.skip("one intra-op thread here: the thread-count comparison needs two")
    monkeypatch.setattr(fixed, "dot16", _skewed(fixed.dot16, when))
    monkeypatch.setattr(invariant, "_CORE", {})  # measure again (once per process otherwise)
    with pytest.raises(SettingsError, match=says) as e:
        load_frozen_model("tiny-gemma3", INVARIANT)
    assert "\n" not in str(e.value) and "leave determinism.batch_invariant off" in str(e.value)
    if "golden" in says:
        assert invariant.unavailable() == str(e.value)
