"""kvstore.testing.random_models: the real-architecture configs build and describe their KV state (no download)."""

from __future__ import annotations

import pytest

from kvstore import ModelLoadError
from kvstore.backends.transformers.model import layer_layout
from kvstore.testing.random_models import kv_bytes, model_config


def test_the_full_configs_have_their_families_layouts_and_kv_sizes():
    g1 = model_config("gemma3-1b-class", small=False)
    lay = layer_layout(g1)
    assert len(lay) == 26 and [x["kind"] for x in lay].count("full") == 4
    assert {x["window"] for x in lay if x["kind"] == "sliding"} == {512}
    assert kv_bytes(g1, 1) == 26 * 2 * 1 * 256 * 2  # bf16: 26 layers x K+V x 1 head x 256
    g12 = model_config("gemma3-12b-class", small=False)
    full, sliding = 8, 40  # every 6th of 48 layers is full attention
    assert kv_bytes(g12, 32768) == (full * 32768 + sliding * 1023) * 2 * 8 * 256 * 2  # ~2.5 GB
    llama = model_config("llama3-8b-class", small=False)
    assert all(x["kind"] == "full" for x in layer_layout(llama)) and kv_bytes(llama, 1) == 32 * 2 * 8 * 128 * 2


def test_the_issue_33_configs_match_their_published_shapes():
    g4 = model_config("gemma3-4b-class", small=False)
    lay = layer_layout(g4)
    assert len(lay) == 34 and [x["kind"] for x in lay].count("full") == 5
    assert kv_bytes(g4, 1) == 34 * 2 * 4 * 256 * 2
    q15 = model_config("qwen2.5-1.5b-class", small=False)  # the shapes of the 1.5B GGUF (docs/models.md)
    assert [x["kind"] for x in layer_layout(q15)] == ["full"] * 28
    assert kv_bytes(q15, 1) == 28 * 2 * 2 * 128 * 2 and q15.vocab_size == 151936
    q7 = model_config("qwen2.5-7b-class", small=False)
    assert [x["kind"] for x in layer_layout(q7)] == ["full"] * 28 and kv_bytes(q7, 1) == 28 * 2 * 4 * 128 * 2


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match="gemma3-1b-class"):
        model_config("gpt-5-class", small=True)
