"""Every architecture grafts exactly or is refused in one line (issue 20; docs/exactness.md holds the table).

One tiny random checkpoint per architecture (kvstore.backends.transformers.tiny.save_architecture: transformers' own config classes, no
download, windows and chunks of 8 tokens). For each, one of:
- exact: the graft's suffix logits are SHA-256-equal to the fresh reference at prefixes below (5) and past (20, 40)
  every window/chunk, and the layer layout names each kind;
- refused at deposit: a one-line CaptureError (a KVStoreError) naming the layer index, its kind and class and what
  cannot be captured;
- refused at load: a one-line KVStoreError (the attention implementation to set; not a causal LM).
Never a different logit without an error, never a foreign exception.

Plus the rule itself, on state no code names: an attribute added to one layer of a real cache is refused at
deposit; a model cache layer with a slot an artifact cannot fill is refused at graft.
"""

from __future__ import annotations

import pytest
import torch

from kvstore import Determinism, IncompatibleError, KVStoreError, SettingsError, check_graft
from kvstore.backends.transformers import TransformersBackend, load_frozen_model, prefill
from kvstore.backends.transformers.capture import capture_snapshot
from kvstore.backends.transformers.model import layout_string
from kvstore.backends.transformers.tiny import ARCHITECTURES, save_architecture
from kvstore.errors import CaptureError, UnsupportedModelError

SUFFIX = [4 + ord(c) for c in " hence 12"]
PREFIXES = (5, 20, 40)  # below the 8-token windows/chunks, past them (2.5 and 5 chunks)

# name -> (attention implementation, layout string, outcome): "exact", or (error class, words the message has)
EXPECTED: dict[str, tuple[str, str, object]] = {
    "gpt-oss": ("eager", "SF", "exact"),
    "llama4-text": ("sdpa", "CCCF", "exact"),
    "qwen3-moe": ("sdpa", "FF", "exact"),
    "smollm3": ("sdpa", "FFFF", "exact"),
    "exaone4": ("sdpa", "SSSF", "exact"),
    "granite": ("sdpa", "FF", "exact"),
    "granitemoe": ("sdpa", "FF", "exact"),
    "gemma2": ("eager", "SF", "exact"),
    "gemma3n": ("sdpa", "SFSF", "exact"),
    "gemma3n-kv-shared": ("sdpa", "SFXX", (CaptureError, ["layer 2 (shared, DummyLayer)", "no keys/values"])),
    "qwen3-next": ("sdpa", "LLLF", (CaptureError, ["layer 0 (linear, LinearAttentionLayer)", "conv_states[0]",
                                                   "recurrent_states[0]"])),
    "jamba": ("sdpa", "LF", (CaptureError, ["layer 0 (linear, LinearAttentionLayer)", "conv_states[0]"])),
    "zamba2": ("sdpa", "LH", (CaptureError, ["layer 0 (linear, LinearAttentionLayer)", "recurrent_states[0]"])),
    "zamba2-hybrid-first": ("sdpa", "HL", (CaptureError, ["layer 0 (hybrid, LinearAttentionAndFullAttentionLayer)",
                                                          "besides keys and values", "conv_states[0]"])),
    "mamba2": ("eager", "LL", (CaptureError, ["layer 0 (linear, LinearAttentionLayer)", "conv_states[0]"])),
    "deepseek-v3": ("sdpa", "AA", (CaptureError, ["layer 0 (latent, DynamicLayer)", "keys (1, 1, 5, 16)",
                                                  "values (1, 1, 5, 8)"])),
    "t5": ("sdpa", "", (UnsupportedModelError, ["kvgraft supports causal LMs", "t5"])),
}
# Refused under sdpa at load, with the setting to change (then EXPECTED under eager).
NEEDS_EAGER = ("gpt-oss", "gemma2", "mamba2")


def prompt_ids(n: int) -> list[int]:
    return [2] + [4 + (53 * i + 17) % 256 for i in range(n - 1)]


def test_the_matrix_covers_every_tiny_architecture():
    assert set(EXPECTED) == set(ARCHITECTURES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("architectures")
    return {name: str(save_architecture(name, root / name)) for name in ARCHITECTURES}


def _one_line(e: BaseException) -> str:
    message = str(e)
    assert message and "\n" not in message and len(message) < 600, message
    return message


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_architecture_grafts_exactly_or_is_refused_in_one_line(name, folders):
    attn, layout, outcome = EXPECTED[name]
    if outcome == "exact":
        fm = load_frozen_model(folders[name], Determinism(attn_implementation=attn))
        assert layout_string(fm.layer_layout) == layout
        for n in PREFIXES:
            check = check_graft(TransformersBackend.of(fm), prompt_ids(n), SUFFIX)
            assert check.equal and check.sha256_reference == check.sha256_graft, (name, n, check.to_dict())
        return
    cls, words = outcome
    try:
        fm = load_frozen_model(folders[name], Determinism(attn_implementation=attn))
        assert layout_string(fm.layer_layout) == layout
        TransformersBackend.of(fm).deposit(prompt_ids(5))
    except KVStoreError as e:
        assert isinstance(e, cls), f"{name}: {type(e).__name__}: {e}"
        message = _one_line(e)
        for w in words:
            assert w in message, (name, message)
        assert "deposit the artifact again" not in message  # advice that can never work
    else:
        pytest.fail(f"{name}: deposited without an error, but its cache holds state an artifact cannot hold")


@pytest.mark.parametrize("name", NEEDS_EAGER)
def test_an_architecture_without_sdpa_is_refused_at_load_naming_the_setting_and_the_flag(name, folders):
    with pytest.raises(SettingsError) as info:
        load_frozen_model(folders[name], Determinism(attn_implementation="sdpa"))
    message = _one_line(info.value)
    assert "set determinism.attn_implementation=eager" in message and "--attn-implementation eager" in message


def test_layer_layouts_name_every_kind_and_never_call_an_unknown_one_full(folders):
    from transformers import AutoConfig

    from kvstore.backends.transformers.model import layer_layout

    zamba = layer_layout(AutoConfig.from_pretrained(folders["zamba2"]))
    assert [x["kind"] for x in zamba] == ["linear", "hybrid"]
    shared = layer_layout(AutoConfig.from_pretrained(folders["gemma3n-kv-shared"]))
    assert [x["kind"] for x in shared] == ["sliding", "full", "shared", "shared"]
    llama4 = layer_layout(AutoConfig.from_pretrained(folders["llama4-text"]))
    assert llama4[0] == {"kind": "chunked", "window": 8} and llama4[3] == {"kind": "full", "window": None}
    cfg = AutoConfig.from_pretrained(folders["qwen3-moe"])
    cfg.layer_types = ["full_attention", "some_future_attention"]  # a type this code has never seen
    assert [x["kind"] for x in layer_layout(cfg)] == ["full", "some_future_attention"]
    assert layout_string(layer_layout(cfg)) == "F?"


def test_state_no_code_names_is_refused_at_deposit(tiny_gemma3):
    """The rule is generic: any tensor the prefix leaves in a layer beyond keys and values is refused."""
    ids = prompt_ids(20)
    cache, _ = prefill(tiny_gemma3, ids)
    capture_snapshot(tiny_gemma3, cache, ids)  # as the model left it: complete
    cache.layers[2].prefix_summary = torch.ones(1, 4)  # state a future layer class might keep
    with pytest.raises(CaptureError) as info:
        capture_snapshot(tiny_gemma3, cache, ids)
    message = _one_line(info.value)
    assert "layer 2 (full, DynamicLayer)" in message and "prefix_summary (tensor (1, 4) float32)" in message


def test_bookkeeping_a_rebuild_does_not_reproduce_is_refused_at_deposit(tiny_gemma3):
    ids = prompt_ids(20)
    cache, _ = prefill(tiny_gemma3, ids)
    cache.layers[0].record_past = True  # bookkeeping the artifact cannot carry: the rebuilt layer differs
    with pytest.raises(CaptureError) as info:
        capture_snapshot(tiny_gemma3, cache, ids)
    message = _one_line(info.value)
    assert "layer 0 (sliding, DynamicSlidingWindowLayer)" in message and "record_past: True vs False" in message


def test_a_model_cache_layer_with_a_slot_the_artifact_cannot_fill_is_refused_at_graft(tiny_llama, monkeypatch):
    import kvstore.backends.transformers.restore as restore
    from kvstore.backends.transformers import TransformersBackend

    snap = TransformersBackend.of(tiny_llama).deposit(prompt_ids(12))
    real = restore.new_cache

    def with_an_unfillable_slot(fm):
        cache = real(fm)
        cache.layers[1].summary_state = None  # a slot the model would fill and the artifact cannot
        return cache

    monkeypatch.setattr(restore, "new_cache", with_an_unfillable_slot)  # the cache the rebuild starts from
    with pytest.raises(IncompatibleError) as info:
        TransformersBackend.of(tiny_llama).graft(snap)
    message = _one_line(info.value)
    assert "cannot graft layer 1 (full, DynamicLayer)" in message and "summary_state" in message


def test_a_chunked_layer_is_stored_as_the_sliding_cache_it_is(folders):
    """transformers builds chunked and sliding layers as the same DynamicSlidingWindowLayer; the artifact records
    the bytes it holds ("sliding", the last window - 1 positions), the model's layout names the kind ("chunked")."""
    from kvstore.backends.transformers.model import stored_layout

    fm = load_frozen_model(folders["llama4-text"])
    snap = TransformersBackend.of(fm).deposit(prompt_ids(20))
    assert [x["kind"] for x in fm.layer_layout] == ["chunked"] * 3 + ["full"]
    assert snap.layout == stored_layout(fm.layer_layout) == [{"kind": "sliding", "window": 8}] * 3 + [
        {"kind": "full", "window": None}]
    assert [lyr.keys.shape[-2] for lyr in snap.layers] == [7, 7, 7, 20]
    assert stored_layout([{"kind": "linear", "window": None}]) is None
