"""kvstore.engine.verify: the exactness procedure in one function. check_graft reports graft vs fresh reference with
both SHA-256s, KL, max |d|, argmax agreement and timings; the one-shot comparison is reported when asked, never
folded into the verdict; a graft that is not the fresh computation is reported as not equal."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore import KVStoreError, LocalStore, MemoryStore, check_graft, compare_logits
from kvstore.backends.transformers import TransformersBackend
from kvstore.engine.verify import Restored, graft_logits, reference_logits

SUFFIX = [4 + ord(c) for c in " so x = 5"]


def prompt_ids(n: int) -> list[int]:
    return [2] + [4 + (29 * i + 5) % 256 for i in range(n - 1)]


def test_check_graft_through_a_store_is_exact_and_times_each_stage(tiny_gemma3, tmp_path):
    store = LocalStore(tmp_path / "store")
    check = check_graft(TransformersBackend.of(tiny_gemma3), prompt_ids(24), SUFFIX, store, tags=["t"], extra={"why": "test"})
    assert check.equal and check.sha256_reference == check.sha256_graft and len(check.sha256_graft) == 64
    assert (check.kl_max, check.max_abs_diff, check.argmax_agreement) == (0.0, 0.0, 1.0)
    assert (check.prefix_tokens, check.suffix_tokens, check.offset) == (24, len(SUFFIX), 0)
    assert check.oneshot is None  # not asked for
    tags = store.info(check.artifact_id).tags  # the tag given, and the numerics measured at deposit (issue 51)
    assert tags == ("numerics:" + tiny_gemma3.numerics_sha256, "t")
    assert store.get(check.artifact_id).extra == {"why": "test"}
    assert {"deposit", "put", "reference", "restore", "get", "graft", "forward"} <= set(check.timing_s)
    assert all(v >= 0 for v in check.timing_s.values())
    d = check.to_dict()
    assert d["equal"] is True and d["graft"]["sha256_a"] == check.sha256_reference and "reference_logits" not in d


def test_without_a_store_the_snapshot_is_grafted_from_memory(tiny_llama):
    check = check_graft(TransformersBackend.of(tiny_llama), prompt_ids(9), SUFFIX)
    assert check.equal and check.artifact_id is None and "get" not in check.timing_s


def test_the_oneshot_comparison_is_reported_not_hidden(tiny_gemma3):
    check = check_graft(TransformersBackend.of(tiny_gemma3), prompt_ids(30), SUFFIX, oneshot=True, keep_logits=True)
    assert check.equal
    assert check.oneshot is not None and check.oneshot.sha256_a == check.sha256_reference
    assert 0 <= check.oneshot.max_abs_diff < 1e-3 and check.oneshot.argmax_agreement == 1.0
    assert check.reference_logits.shape == (1, len(SUFFIX), tiny_gemma3.config.vocab_size)


def test_a_graft_that_is_not_the_fresh_computation_is_reported_unequal(tiny_gemma3):
    """The check can fail: a restorer that returns slightly perturbed logits is caught by the hash."""
    store = MemoryStore()
    prefix = prompt_ids(20)

    def tampered(aid: str) -> Restored:
        r = graft_logits(TransformersBackend.of(tiny_gemma3), prefix, SUFFIX, store=store, artifact_id=aid)
        logits = r.logits.clone()
        logits[0, -1, 7] = torch.nextafter(logits[0, -1, 7], torch.tensor(float("inf")))
        return Restored(logits, r.timing_s)

    check = check_graft(TransformersBackend.of(tiny_gemma3), prefix, SUFFIX, store, restore=tampered)
    assert not check.equal and check.sha256_reference != check.sha256_graft
    assert 0 < check.max_abs_diff < 1e-5 and check.argmax_agreement == 1.0


def test_a_custom_restorer_gets_the_artifact_id(tiny_llama):
    store, seen = MemoryStore(), []
    prefix = prompt_ids(12)

    def restore(aid: str) -> Restored:
        seen.append(aid)
        return graft_logits(TransformersBackend.of(tiny_llama), prefix, SUFFIX, store=store, artifact_id=aid)

    check = check_graft(TransformersBackend.of(tiny_llama), prefix, SUFFIX, store, restore=restore)
    assert seen == [check.artifact_id] and check.equal


def test_a_given_snapshot_is_used_instead_of_a_new_deposit(tiny_gemma3):
    prefix = prompt_ids(18)
    snap = TransformersBackend.of(tiny_gemma3).deposit(prefix)
    check = check_graft(TransformersBackend.of(tiny_gemma3), prefix, SUFFIX, snapshot=snap)
    assert check.equal and "deposit" not in check.timing_s


def test_offset_zero_is_exact_and_reported_positions_move_the_reference(tiny_llama):
    prefix = prompt_ids(10)
    snap = TransformersBackend.of(tiny_llama).deposit(prefix)
    zero = check_graft(TransformersBackend.of(tiny_llama), prefix, SUFFIX, snapshot=snap, offset=0)
    moved = check_graft(TransformersBackend.of(tiny_llama), prefix, SUFFIX, snapshot=snap, offset=100)
    assert zero.equal and moved.offset == 100
    assert moved.sha256_reference != zero.sha256_reference  # computed at other positions
    assert moved.max_abs_diff < 1e-3  # re-rotated keys: close, as measured, not claimed exact


def test_reference_logits_is_prefill_then_suffix(tiny_gemma3):
    prefix = prompt_ids(20)
    a = reference_logits(TransformersBackend.of(tiny_gemma3), prefix, SUFFIX)
    b = reference_logits(TransformersBackend.of(tiny_gemma3), prefix, SUFFIX)
    assert compare_logits(a, b).sha256_equal  # deterministic under the pinned settings


def test_bad_calls_are_kvstore_errors(tiny_llama):
    with pytest.raises(KVStoreError, match="non-empty prefix and suffix"):
        check_graft(TransformersBackend.of(tiny_llama), prompt_ids(5), [])
    with pytest.raises(KVStoreError, match="needs a store"):
        check_graft(TransformersBackend.of(tiny_llama), prompt_ids(5), SUFFIX, restore=lambda aid: None)
    with pytest.raises(KVStoreError, match="shapes differ"):
        compare_logits(torch.zeros(1, 2, 3), torch.zeros(1, 3, 3))


def test_a_snapshot_of_other_tokens_is_refused_not_compared(tiny_llama):
    snap = TransformersBackend.of(tiny_llama).deposit(prompt_ids(8))
    other = dataclasses.replace(snap, token_ids=[2] * 8)
    with pytest.raises(KVStoreError):
        check_graft(TransformersBackend.of(tiny_llama), prompt_ids(8), SUFFIX, snapshot=other)
