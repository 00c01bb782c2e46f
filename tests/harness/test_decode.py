"""Decoding: stops where a full re-decode would, greedy is deterministic, a graft prefix is not recomputed."""

from __future__ import annotations

import pytest

from harness.decode import generate
from kvstore import deposit_tokens, forward, graft_snapshot, load_frozen_model, new_cache, prefill


@pytest.fixture(scope="module")
def fm():
    return load_frozen_model("tiny-gemma3")


def _reference(fm, ids, max_new_tokens, stop):
    """The plain loop: re-decode the whole text after every token."""
    cache, logits = prefill(fm, ids, new_cache(fm))
    out = []
    for _ in range(max_new_tokens):
        tok = int(logits[0].argmax())
        if tok == fm.tokenizer.eos_token_id:
            break
        out.append(tok)
        text = fm.decode(out)
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return out, text[: min(hits)]
        logits = forward(fm, [tok], cache)[:, -1, :]
    return out, fm.decode(out)


@pytest.mark.parametrize("seed_text", ["Problem: 1+1", "abc", "The answer is", "x" * 30])
@pytest.mark.parametrize("stop", [["\n"], ["a", "zz"], ["!!!", "e"], []])
def test_generation_stops_exactly_where_a_full_redecode_would(fm, seed_text, stop):
    ids = fm.encode(seed_text)
    g = generate(fm, ids, max_new_tokens=24, stop=stop)
    ref_tokens, ref_text = _reference(fm, ids, 24, stop)
    assert (g.token_ids, g.text) == (ref_tokens, ref_text)
    assert g.prefill_tokens == len(ids)


def test_a_grafted_prefix_is_not_prefilled_again_and_decodes_the_same(fm):
    ids = fm.encode("Problem: What is 2+2? Solution: 4.\n\nProblem: What is 2+2?")
    cache = graft_snapshot(deposit_tokens(fm, ids[:20]), fm, token_ids=ids)
    g = generate(fm, ids, max_new_tokens=12, stop=["\n"], cache=cache)
    fresh, _ = prefill(fm, ids[:20], new_cache(fm))  # the same schedule without the store
    plain = generate(fm, ids, max_new_tokens=12, stop=["\n"], cache=fresh)
    assert g.prefill_tokens == plain.prefill_tokens == len(ids) - 20
    assert g.token_ids == plain.token_ids
