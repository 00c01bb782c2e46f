"""Architectures beyond the default: the layer layout is read as transformers' DynamicCache reads it, and every
tiny architecture grafts exactly through kvstore.check_graft.

- tiny-mistral: `sliding_window` 16 and no `layer_types` (Mistral-style). transformers 5 builds every layer of
  its cache as a DynamicSlidingWindowLayer and masks every layer with the window, so the layout says all
  sliding, and prefixes below, at and across the window graft byte-exactly.
- tiny-gemma3 (sliding + full layers) and tiny-llama (full only) through the same check.
- Gemma 2 refuses `sdpa` in transformers: loading it under the default settings is a one-line SettingsError
  naming `determinism.attn_implementation`; with `eager` it loads, records eager, and grafts exactly.
"""

from __future__ import annotations

import pytest

from kvstore import Determinism, LocalStore, SettingsError, check_graft
from kvstore.backends.transformers import TransformersBackend, load_frozen_model, new_cache, prefill
from kvstore.backends.transformers.model import layer_layout, layout_string, smallest_window
from kvstore.backends.transformers.tiny import byte_tokenizer

SUFFIX = [4 + ord(c) for c in " hence 12"]


def prompt_ids(n: int) -> list[int]:
    return [2] + [4 + (53 * i + 17) % 256 for i in range(n - 1)]


@pytest.fixture(scope="module")
def tiny_mistral():
    return load_frozen_model("tiny-mistral")


def test_a_sliding_window_without_layer_types_means_every_layer_slides(tiny_mistral):
    from transformers import MistralConfig

    assert getattr(tiny_mistral.config, "layer_types", None) is None and tiny_mistral.config.sliding_window == 16
    assert tiny_mistral.layer_layout == [{"kind": "sliding", "window": 16}] * 4
    assert layout_string(tiny_mistral.layer_layout) == "SSSS" and smallest_window(tiny_mistral.layer_layout) == 16
    # what transformers' own cache does with that config
    cache = new_cache(tiny_mistral)
    assert [bool(getattr(layer, "is_sliding", False)) for layer in cache.layers] == [True] * 4
    # and without a window the same architecture is all full attention
    no_window = MistralConfig(num_hidden_layers=3, sliding_window=None)
    assert layout_string(layer_layout(no_window)) == "FFF"


@pytest.mark.parametrize("n", [5, 15, 16, 17, 40])  # below, at (window - 1, window) and across the window 16
def test_mistral_style_grafts_are_byte_identical_below_at_and_across_the_window(tiny_mistral, n, tmp_path):
    check = check_graft(TransformersBackend.of(tiny_mistral), prompt_ids(n), SUFFIX, LocalStore(tmp_path / "store"))
    assert check.equal, check.to_dict()
    assert check.kl_max == 0 and check.argmax_agreement == 1.0


def test_a_mistral_style_artifact_across_the_window_keeps_only_the_window(tiny_mistral, tmp_path):
    store = LocalStore(tmp_path / "store")
    check = check_graft(TransformersBackend.of(tiny_mistral), prompt_ids(40), SUFFIX, store)
    snap = store.get(check.artifact_id)
    assert all(lyr.keys.shape[-2] == 15 and lyr.cumulative_length == 40 for lyr in snap.layers)
    cache, _ = prefill(tiny_mistral, prompt_ids(40))
    assert all(layer.keys.shape[-2] == 15 for layer in cache.layers)  # the fresh cache holds the same window


@pytest.mark.parametrize(("fixture", "layout"), [("tiny_gemma3", "SSFSSF"), ("tiny_llama", "FFFF")])
@pytest.mark.parametrize("n", [6, 16, 33])
def test_the_suite_architectures_graft_exactly_through_check_graft(request, fixture, layout, n):
    fm = request.getfixturevalue(fixture)
    assert layout_string(fm.layer_layout) == layout
    check = check_graft(TransformersBackend.of(fm), prompt_ids(n), SUFFIX, oneshot=True)
    assert check.equal and check.oneshot is not None


@pytest.fixture(scope="module")
def gemma2_folder(tmp_path_factory):
    """A tiny random Gemma 2 checkpoint (soft-capping; sliding and full layers alternating, window 8)."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                       pad_token_id=0, eos_token_id=1, bos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gemma2")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return str(folder)


def test_an_architecture_without_the_attention_implementation_fails_in_one_line_naming_the_setting(gemma2_folder):
    with pytest.raises(SettingsError) as info:
        load_frozen_model(gemma2_folder, Determinism(attn_implementation="sdpa"))
    message = str(info.value)
    assert "determinism.attn_implementation='sdpa'" in message
    assert "set determinism.attn_implementation=eager" in message
    assert "\n" not in message


def test_the_same_architecture_under_eager_records_it_and_grafts_exactly(gemma2_folder):
    fm = load_frozen_model(gemma2_folder, Determinism(attn_implementation="eager"))
    assert fm.determinism.attn_implementation == "eager"
    assert layout_string(fm.layer_layout) == "SFSF"
    for n in (5, 8, 20):
        assert check_graft(TransformersBackend.of(fm), prompt_ids(n), SUFFIX).equal
