"""determinism.batch_invariant (kvstore/backends/transformers/invariant.py): a row's bits do not depend on what shares
its call. On tiny random-weight models of every family the mode supports: the one-pass prefill of a prompt equals
prefix + suffix (three splits, across key blocks and sliding windows), a token-by-token decode and n rows decoded in
one call, bit for bit; a family it cannot do is refused at load in one line. Plus the setting's recording (absent at
its default, so no default-mode hash moves) and admission.
"""

from __future__ import annotations

import pytest
import torch

from kvstore import Determinism, IncompatibleError, SettingsError
from kvstore.backends.transformers.backend import TransformersBackend
from kvstore.backends.transformers.capture import forward, new_cache
from kvstore.backends.transformers.invariant import KEY_BLOCK, fixed_linear
from kvstore.backends.transformers.model import load_frozen_model
from kvstore.testing.random_models import build_random_model

INVARIANT = Determinism(batch_invariant=True, prefill_chunk=0)
N = 2 * KEY_BLOCK + 40  # three key blocks, far past the tiny windows (16, 32)


def prompt_ids(n: int) -> list[int]:
    return [2] + [4 + (53 * i + 17) % 256 for i in range(n - 1)]


def _logits(fm, ids, cache=None):
    return forward(fm, ids, cache if cache is not None else new_cache(fm))[0]


def check_property(fm, n: int = N) -> None:
    ids = prompt_ids(n)
    one = _logits(fm, ids)  # every position's logits, one pass
    for split in (1, KEY_BLOCK + 3, n - 1):
        cache = new_cache(fm)
        assert torch.equal(torch.cat([_logits(fm, ids[:split], cache), _logits(fm, ids[split:], cache)]), one), split
    cache = new_cache(fm)
    assert torch.equal(torch.cat([_logits(fm, [t], cache) for t in ids]), one), "token by token"
    # n rows in one call == n single-row runs: 3 rows on one shared prefix, each with its own next token
    nxt = [ids[-1], 7, 90]
    cache = new_cache(fm)
    forward(fm, ids[:-1], cache)
    cache.batch_repeat_interleave(len(nxt))
    out = fm.model(input_ids=torch.tensor([[t] for t in nxt]), position_ids=torch.full((len(nxt), 1), n - 1),
                   past_key_values=cache, use_cache=True).logits[:, -1]
    assert torch.equal(out[0], one[-1])
    for row, t in enumerate(nxt[1:], 1):
        cache = new_cache(fm)
        forward(fm, ids[:-1], cache)
        assert torch.equal(_logits(fm, [t], cache)[-1], out[row]), f"batched row {row}"


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama", "tiny-mistral"])
def test_one_pass_equals_split_token_by_token_and_batched_rows(name):
    check_property(load_frozen_model(name, INVARIANT))


@pytest.mark.parametrize("name", ["qwen2.5-1.5b-class", "gemma3-4b-class"])  # q/k/v biases; 2 KV heads, window 32
def test_the_property_on_the_real_families_shapes(name):
    check_property(build_random_model(name, small=True, determinism=INVARIANT).fm)


def test_the_default_mode_is_not_batch_invariant_here():
    """The contrast that makes the property tests able to fail: without the mode the same checks differ."""
    with pytest.raises(AssertionError):
        check_property(load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0)))


def test_a_rows_bits_do_not_depend_on_the_row_count():
    torch.manual_seed(0)
    w, b, x = torch.randn(96, 48), torch.randn(96), torch.randn(70, 48)
    whole = fixed_linear(x, w, b)
    for m in (1, 2, 3, 5, 9, 13, 33):
        assert torch.equal(fixed_linear(x[:m], w, b), whole[:m]), m


def test_the_one_row_paths_keep_a_rows_bits():
    """The one-row step's products: a wide (LM head) product's row alone == the row among 70, at every position;
    a small product on one thread == the same product on the process's threads."""
    torch.manual_seed(0)
    w, b, x = torch.randn(3000, 48), torch.randn(3000), torch.randn(70, 48)
    whole = fixed_linear(x, w, b)
    for r in (0, 5, 7, 12, 69):
        assert torch.equal(fixed_linear(x[r : r + 1], w, b)[0], whole[r]), r
    w2 = torch.randn(96, 48)
    many = fixed_linear(torch.cat([x[:4], x]), w2)  # 74 rows: the process's threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(fixed_linear(x[:1], w2), many[:1])
    finally:
        torch.set_num_threads(threads)


def test_the_setting_is_recorded_only_when_true_and_checked():
    assert "batch_invariant" not in Determinism().to_dict()  # the default mode's dicts and hashes do not move
    assert Determinism(batch_invariant=True).to_dict()["batch_invariant"] is True
    assert Determinism.from_dict(Determinism(batch_invariant=True).to_dict()) == Determinism(batch_invariant=True)
    with pytest.raises(SettingsError, match="determinism.batch_invariant"):
        Determinism(batch_invariant=1)
    with pytest.raises(SettingsError, match="float32 only"):
        Determinism(batch_invariant=True, dtype="bfloat16")


def test_the_fingerprint_is_the_same_and_admission_refuses_mixing_the_modes():
    inv = load_frozen_model("tiny-gemma3", INVARIANT)
    default = load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0))
    assert inv.fingerprint == default.fingerprint
    ids = prompt_ids(30)
    for made, other in ((inv, default), (default, inv)):
        snap = TransformersBackend.of(made).deposit(ids)
        with pytest.raises(IncompatibleError, match="determinism.batch_invariant"):
            TransformersBackend.of(other).graft(snap, token_ids=ids + [9])


def test_a_graft_in_the_mode_equals_the_one_pass_prompt():
    fm = load_frozen_model("tiny-gemma3", INVARIANT)
    ids, suffix = prompt_ids(N), [9, 40, 41]
    cache = TransformersBackend.of(fm).graft(TransformersBackend.of(fm).deposit(ids), token_ids=ids + suffix)
    assert torch.equal(_logits(fm, suffix, cache), _logits(fm, ids + suffix)[-len(suffix):])


def test_other_backends_refuse_the_mode_in_one_line():
    from kvstore import load_backend

    for name in ("llamacpp", "vllm"):
        with pytest.raises(SettingsError, match=f"batch_invariant=true on the {name} backend") as e:
            load_backend(name, determinism=INVARIANT)
        assert "\n" not in str(e.value)


# The architecture matrix (tests/kvstore/test_architecture_matrix.py): the families that graft exactly, in the mode.
MATRIX_EXACT = ("smollm3", "exaone4", "granite", "gemma2", "gemma3n")
# Refused at load in one line: mixture-of-experts banks and attention sinks are not tiled by the mode.
MATRIX_REFUSED = {"gpt-oss": "attention sink logits", "llama4-text": "gate_up_proj", "qwen3-moe": "gate_up_proj",
                  "granitemoe": "used outside torch.nn.Linear"}


@pytest.mark.parametrize("name", MATRIX_EXACT + tuple(MATRIX_REFUSED))
def test_the_architecture_matrix_in_the_mode(name, tmp_path):
    from kvstore.backends.transformers.tiny import save_architecture

    save_architecture(name, tmp_path / name)
    det = Determinism(batch_invariant=True, prefill_chunk=0,
                      attn_implementation="eager" if name in ("gemma2", "gpt-oss") else "sdpa")  # as they load
    if name in MATRIX_REFUSED:
        with pytest.raises(SettingsError, match=MATRIX_REFUSED[name]) as e:
            load_frozen_model(str(tmp_path / name), det)
        assert "\n" not in str(e.value) and "determinism.batch_invariant" in str(e.value)
    else:
        check_property(load_frozen_model(str(tmp_path / name), det), n=KEY_BLOCK + 20)


@pytest.mark.integration
def test_the_bundled_model_in_the_mode_one_pass_equals_split_token_by_token_and_graft():
    """The bundled Gemma 3 270M (fp32): a 560-token prompt, past its 512-token sliding window. One pass == prefix
    (the first 300 tokens, then the rest) == the last 3 tokens fed one by one, and a graft of the first 540 tokens
    followed by the last 20 equals the one-pass prompt's last 20 positions, bit for bit."""
    fm = load_frozen_model("gemma3-270m", INVARIANT)
    text = ("Problem: Find the number of ordered pairs of positive integers (m, n) such that m^2 n = 20^20. "
            "Solution: write 20^20 = 2^40 5^20; n must be a perfect-square quotient, so count the exponent choices. ")
    ids = fm.encode(text * 20)[:560]
    assert len(ids) == 560
    one = _logits(fm, ids)
    cache = new_cache(fm)
    assert torch.equal(torch.cat([_logits(fm, ids[:300], cache), _logits(fm, ids[300:], cache)]), one)
    cache = new_cache(fm)
    head = _logits(fm, ids[:-3], cache)
    tail = torch.cat([_logits(fm, [t], cache) for t in ids[-3:]])
    assert torch.equal(torch.cat([head, tail]), one), "token by token"
    grafted = TransformersBackend.of(fm).graft(TransformersBackend.of(fm).deposit(ids[:540]), token_ids=ids)
    assert torch.equal(_logits(fm, ids[540:], grafted), one[540:]), "graft at own position vs one pass"


def test_the_mode_has_its_own_numerics_fingerprint():
    """Measured on the mode's kernels (its tiled products, LM head, block attention): another value than the
    default's, which stays the default kernels' (no default-mode artifact or registration moves); the same on 1 and 2
    threads (its products split the output, never a sum)."""
    from kvstore.backends.transformers.invariant import numerics_fingerprint
    from kvstore.environment import numerics_battery_dims
    from kvstore.environment import numerics_fingerprint as default_numerics

    inv = load_frozen_model("tiny-gemma3", INVARIANT)
    default = load_frozen_model("tiny-gemma3", Determinism(prefill_chunk=0))
    dims = numerics_battery_dims(inv.config)
    assert TransformersBackend.of(inv).numerics() == numerics_fingerprint(dims)
    assert TransformersBackend.of(default).numerics() == default_numerics(dims, "float32", "cpu")
    assert inv.numerics_sha256 != default.numerics_sha256
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert numerics_fingerprint(dims) == inv.numerics_sha256
    finally:
        torch.set_num_threads(threads)
