"""Decoding: stops where a full re-decode would, greedy is deterministic, a graft prefix is not recomputed."""

from __future__ import annotations

import pytest

from harness.decode import STOP_REASONS, generate
from harness.errors import ConfigError
from kvstore import deposit_tokens, forward, graft_snapshot, load_frozen_model, logits_sha256, new_cache, prefill


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
    assert g.first_logits_sha256 == plain.first_logits_sha256


def test_first_logits_hash_is_that_of_the_logits_that_chose_the_first_token(fm):
    ids = fm.encode("Problem: 3+4")
    _, logits = prefill(fm, ids, new_cache(fm))
    g = generate(fm, ids, max_new_tokens=4)
    assert g.first_logits_sha256 == logits_sha256(logits)
    assert g.token_ids[:1] == [int(logits[0].argmax())] or g.stop_reason == "eos"
    assert 0.0 < g.ttft_s
    assert g.stop_reason in STOP_REASONS


def test_stop_reason_names_what_ended_the_generation(fm):
    ids = fm.encode("The answer is")
    budget = generate(fm, ids, max_new_tokens=3)
    assert (budget.stop_reason, len(budget.token_ids)) == ("length", 3)
    first = fm.decode(budget.token_ids[:1])
    stopped = generate(fm, ids, max_new_tokens=3, stop=[first])
    assert stopped.stop_reason == "stop" and stopped.text == ""


def test_a_bad_strategy_or_budget_is_a_config_error(fm):
    with pytest.raises(ConfigError, match="strategy"):
        generate(fm, fm.encode("a"), max_new_tokens=2, strategy="beam")
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(fm, fm.encode("a"), max_new_tokens=0)
