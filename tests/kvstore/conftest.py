"""Shared fixtures for the kvstore tests: the tiny random-weight models (loaded once per session), a
hand-built snapshot that needs no model at all, and a snapshot comparison. Helpers are fixtures (not imports)
so that they work under any pytest import mode.

tiny-gemma3 has 6 layers (sliding, sliding, full) x 2 with window 16, so a prefix of 16+ tokens crosses the
window; tiny-llama has 4 full-attention layers. Both use a byte-level tokenizer (ids 0-3 special, 4-259 bytes).
"""

from __future__ import annotations

import pytest
import torch

from kvstore import Snapshot
from kvstore.backends.transformers import FrozenModel, load_frozen_model
from kvstore.format.artifact import LayerKV


@pytest.fixture(scope="session")
def tiny_gemma3() -> FrozenModel:
    return load_frozen_model("tiny-gemma3")


@pytest.fixture(scope="session")
def tiny_llama() -> FrozenModel:
    return load_frozen_model("tiny-llama")


def _hand_built_snapshot(extra: dict | None = None) -> Snapshot:
    """A small snapshot with fixed tensors and fixed fingerprints: one full layer and one sliding layer
    (window 4, so it holds the last min(5, 4 - 1) = 3 of the 5 positions)."""
    full_k = torch.arange(1 * 2 * 5 * 4, dtype=torch.float32).reshape(1, 2, 5, 4)  # (batch, kv_heads, seq, head_dim)
    slide_k = torch.arange(1 * 2 * 3 * 4, dtype=torch.float32).reshape(1, 2, 3, 4) / 8
    return Snapshot(
        token_ids=[2, 5, 7, 11, 13],
        start_position=0,
        layers=[
            LayerKV("full", None, 5, full_k, -full_k),
            LayerKV("sliding", 4, 5, slide_k, slide_k + 0.5),
        ],
        model_fingerprint="a" * 64,
        tokenizer_fingerprint="b" * 64,
        dtype="float32",
        determinism={"attn_implementation": "sdpa", "deterministic_algorithms": True, "dtype": "float32",
                     "prefill_chunk": 512, "threads": 2},
        environment={"cpu_isa": "AVX2", "device_kind": "cpu", "device_name": "golden", "machine": "x86_64",
                     "python": "3.11.0", "torch": "2.0.0", "transformers": "5.0.0"},
        model_name="golden",
        extra=dict(extra or {}),
    )


def _assert_same_snapshot(a: Snapshot, b: Snapshot) -> None:
    """Every field equal and every tensor equal in dtype, shape and bytes."""
    for f in ("token_ids", "start_position", "model_fingerprint", "tokenizer_fingerprint", "dtype",
              "determinism", "environment", "model_name", "extra"):
        assert getattr(a, f) == getattr(b, f), f
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert (la.kind, la.window, la.cumulative_length) == (lb.kind, lb.window, lb.cumulative_length)
        for ta, tb in ((la.keys, lb.keys), (la.values, lb.values)):
            assert ta.dtype == tb.dtype and ta.shape == tb.shape
            assert torch.equal(ta.cpu(), tb.cpu())


@pytest.fixture
def hand_built():
    """Factory of the hand-built snapshot: hand_built(extra=None) -> Snapshot (fresh tensors each call)."""
    return _hand_built_snapshot


@pytest.fixture
def assert_same_snapshot():
    """assert_same_snapshot(a, b): every field equal, every tensor equal in dtype, shape and values."""
    return _assert_same_snapshot
