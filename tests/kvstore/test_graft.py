"""Graft is exact at own position, through the store, before, at and beyond the sliding window; and every
incompatible use is refused with an error that names what differs.

Exact means: the suffix logits after deposit -> LocalStore put -> get -> graft have the same SHA-256 as the
fresh reference (prefill the prefix under the same schedule, then the same suffix): `kvstore.check_graft`."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore import Determinism, IncompatibleError, IntegrityError, LocalStore, check_graft
from kvstore.backends.transformers import TransformersBackend, forward, load_frozen_model, prefill

MODELS = ["tiny-gemma3", "tiny-llama"]
SUFFIX = [4 + ord(c) for c in " then"]  # byte tokens


def prompt_ids(n: int, salt: int = 0) -> list[int]:
    """n token ids: BOS (2), then a fixed pseudo-random walk over the 256 byte tokens."""
    return [2] + [4 + (37 * i + 11 + salt) % 256 for i in range(n - 1)]


@pytest.fixture
def fm(request):
    return request.getfixturevalue(request.param.replace("-", "_"))


def _through_store(fm, prefix, tmp_path):
    store = LocalStore(tmp_path / "store")
    aid = store.put(TransformersBackend.of(fm).deposit(prefix))
    return store.get(aid)


def _greedy(fm, cache, logits, n: int) -> list[int]:
    """n greedy tokens, one forward per token, starting from the last position's logits."""
    out = []
    for _ in range(n):
        out.append(int(logits[0, -1].argmax()))
        logits = forward(fm, [out[-1]], cache)
    return out


@pytest.mark.parametrize("fm", MODELS, indirect=True)
@pytest.mark.parametrize("n", [5, 15, 16, 17, 40, 100])
def test_graft_from_the_store_gives_byte_identical_suffix_logits(fm, n, tmp_path):
    check = check_graft(TransformersBackend.of(fm), prompt_ids(n), SUFFIX, LocalStore(tmp_path / "store"))
    assert check.artifact_id is not None  # went through put and a verified get
    assert check.equal and check.sha256_graft == check.sha256_reference
    assert check.kl_max == 0 and check.max_abs_diff == 0 and check.argmax_agreement == 1.0


@pytest.mark.parametrize("fm", MODELS, indirect=True)
@pytest.mark.parametrize("n", [15, 40])
def test_greedy_continuation_after_graft_is_identical(fm, n, tmp_path):
    prefix = prompt_ids(n, salt=3)
    cache, _ = prefill(fm, prefix)
    reference = _greedy(fm, cache, forward(fm, SUFFIX, cache), 10)

    cache = TransformersBackend.of(fm).graft(_through_store(fm, prefix, tmp_path), prefix + SUFFIX)
    assert _greedy(fm, cache, forward(fm, SUFFIX, cache), 10) == reference


def test_grafted_sliding_layers_restore_the_window_state(tiny_gemma3, tmp_path):
    prefix = prompt_ids(40)
    fresh, _ = prefill(tiny_gemma3, prefix)
    grafted = TransformersBackend.of(tiny_gemma3).graft(_through_store(tiny_gemma3, prefix, tmp_path), prefix)
    for a, b in zip(fresh.layers, grafted.layers, strict=True):
        assert type(a) is type(b)
        assert a.get_seq_length() == b.get_seq_length() == 40
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        if a.is_sliding:
            assert b.keys.shape[-2] == 15 and b.cumulative_length == 40


def test_bfloat16_artifacts_graft_exactly_into_a_bfloat16_model(tmp_path):
    fm = load_frozen_model("tiny-gemma3", Determinism(dtype="bfloat16"))
    store = LocalStore(tmp_path / "store")
    check = check_graft(TransformersBackend.of(fm), prompt_ids(20), SUFFIX, store, keep_logits=True)
    assert store.get(check.artifact_id).layers[0].keys.dtype == torch.bfloat16
    assert check.graft_logits.dtype == torch.bfloat16
    assert check.equal


# --- refusals -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_snapshot(tiny_gemma3):
    return TransformersBackend.of(tiny_gemma3).deposit(prompt_ids(20))


def test_graft_into_a_model_with_other_weights_is_refused(gemma_snapshot):
    other = load_frozen_model("tiny-gemma3", seed=1)
    with pytest.raises(IncompatibleError, match="model fingerprint"):
        TransformersBackend.of(other).graft(gemma_snapshot)


def test_graft_with_another_tokenizer_is_refused(gemma_snapshot, tiny_gemma3, monkeypatch):
    monkeypatch.setattr(tiny_gemma3, "tokenizer_fingerprint", "0" * 64)
    with pytest.raises(IncompatibleError, match="tokenizer fingerprint"):
        TransformersBackend.of(tiny_gemma3).graft(gemma_snapshot)


def test_graft_into_a_model_of_another_dtype_is_refused(gemma_snapshot):
    bf16 = load_frozen_model("tiny-gemma3", Determinism(dtype="bfloat16"))
    with pytest.raises(IncompatibleError, match="model fingerprint"):  # the weights' dtype is fingerprinted
        TransformersBackend.of(bf16).graft(gemma_snapshot)
    same_weights = dataclasses.replace(gemma_snapshot, model_fingerprint=bf16.fingerprint)
    with pytest.raises(IncompatibleError, match="dtype float32 differs from the model's bfloat16"):
        TransformersBackend.of(bf16).check(same_weights)


def test_a_layer_whose_tensors_contradict_the_recorded_dtype_is_refused(gemma_snapshot, tiny_gemma3):
    layers = list(gemma_snapshot.layers)
    layers[2] = dataclasses.replace(layers[2], keys=layers[2].keys.to(torch.bfloat16))
    with pytest.raises(IncompatibleError, match="layer 2 keys"):
        TransformersBackend.of(tiny_gemma3).check(dataclasses.replace(gemma_snapshot, layers=layers))


def test_graft_of_another_architecture_is_refused(tiny_llama, tiny_gemma3):
    llama = TransformersBackend.of(tiny_llama).deposit(prompt_ids(20))
    with pytest.raises(IncompatibleError, match="model fingerprint"):
        TransformersBackend.of(tiny_gemma3).graft(llama)
    # With the fingerprints edited to match, the layer layout check still catches it.
    disguised = dataclasses.replace(llama, model_fingerprint=tiny_gemma3.fingerprint,
                                    tokenizer_fingerprint=tiny_gemma3.tokenizer_fingerprint)
    with pytest.raises(IncompatibleError, match="numerics_sha256: artifact"):  # its numerics record is llama's
        TransformersBackend.of(tiny_gemma3).check(disguised)
    disguised.numerics = TransformersBackend.of(tiny_gemma3).deposit(prompt_ids(2)).numerics  # and with that edited too
    layout = r"layer layout differs \(artifact 4 layers FFFF, model 6 layers SSFSSF\)"
    with pytest.raises(IncompatibleError, match=layout):
        TransformersBackend.of(tiny_gemma3).check(disguised)


def test_a_layer_with_another_window_is_a_layout_mismatch(gemma_snapshot, tiny_gemma3):
    layers = list(gemma_snapshot.layers)
    layers[0] = dataclasses.replace(layers[0], window=32)
    # the format's own invariant (a sliding layer holds min(seen, window) positions) refuses it first, naming both
    with pytest.raises(IncompatibleError, match=r"layer 0 keys have shape .*sliding layer \(window 32\)"):
        TransformersBackend.of(tiny_gemma3).graft(dataclasses.replace(gemma_snapshot, layers=layers))


def test_graft_onto_a_context_with_other_tokens_is_refused(gemma_snapshot, tiny_gemma3):
    context = list(gemma_snapshot.token_ids) + SUFFIX
    context[7] += 1
    with pytest.raises(IncompatibleError, match="first difference at index 7"):
        TransformersBackend.of(tiny_gemma3).graft(gemma_snapshot, context)
    with pytest.raises(IncompatibleError, match="do not begin with the artifact's 20 tokens"):
        TransformersBackend.of(tiny_gemma3).graft(gemma_snapshot, gemma_snapshot.token_ids[:-1])


def test_graft_at_another_position_is_refused(gemma_snapshot, tiny_gemma3):
    with pytest.raises(IncompatibleError, match="position 3, but the artifact was computed at start position 0"):
        TransformersBackend.of(tiny_gemma3).graft(gemma_snapshot, position=3)
    shifted = dataclasses.replace(gemma_snapshot, start_position=3)
    with pytest.raises(IncompatibleError, match="starts at position 3"):
        TransformersBackend.of(tiny_gemma3).graft(shifted)


def _stored(snapshot, tmp_path):
    store = LocalStore(tmp_path / "store")
    aid = store.put(snapshot)
    return store, aid, store.path(aid)


def test_a_corrupted_object_on_disk_never_reaches_graft(gemma_snapshot, tmp_path):
    store, aid, path = _stored(gemma_snapshot, tmp_path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40  # inside the last layer's values
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=aid):
        store.get(aid)


def test_a_truncated_object_on_disk_never_reaches_graft(gemma_snapshot, tmp_path):
    store, aid, path = _stored(gemma_snapshot, tmp_path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(IntegrityError, match="corrupted or truncated"):
        store.get(aid)
