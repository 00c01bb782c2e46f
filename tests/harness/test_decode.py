"""Decoding: stops where a full re-decode would, greedy is deterministic, a graft prefix is not recomputed;
batched sampling reproduces itself, equals batch size 1 at n=1, and each row stops on its own."""

from __future__ import annotations

import pytest
import torch

from harness.errors import ConfigError
from harness.run.decode import STOP_REASONS, Sampling, _pick, generate, generate_batch
from kvstore import load_backend, logits_sha256
from kvstore.backends.transformers import forward, new_cache, prefill


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers", source="tiny-gemma3")


def _reference(fm, ids, max_new_tokens, stop):
    """The plain loop: re-decode the whole text after every token."""
    cache, logits = prefill(fm.fm, ids, new_cache(fm.fm))
    out = []
    for _ in range(max_new_tokens):
        tok = int(logits[0].argmax())
        if tok == fm.fm.tokenizer.eos_token_id:
            break
        out.append(tok)
        text = fm.decode(out)
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            return out, text[: min(hits)]
        logits = forward(fm.fm, [tok], cache)[:, -1, :]
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
    cache = fm.graft(fm.deposit(ids[:20]), token_ids=ids)
    g = generate(fm, ids, max_new_tokens=12, stop=["\n"], cache=cache)
    fresh, _ = prefill(fm.fm, ids[:20], new_cache(fm.fm))  # the same schedule without the store
    plain = generate(fm, ids, max_new_tokens=12, stop=["\n"], cache=fresh)
    assert g.prefill_tokens == plain.prefill_tokens == len(ids) - 20
    assert g.token_ids == plain.token_ids
    assert g.first_logits_sha256 == plain.first_logits_sha256


def test_first_logits_hash_is_that_of_the_logits_that_chose_the_first_token(fm):
    ids = fm.encode("Problem: 3+4")
    _, logits = prefill(fm.fm, ids, new_cache(fm.fm))
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


def _one_at_a_time(fm, ids, max_new_tokens, stop, strategy, seed):
    """The batch-size-1 loop `generate` ran before batching (the oracle for n=1): same picks, same stops."""
    gen = torch.Generator(device="cpu").manual_seed(seed) if strategy == "sample" else None
    cache, logits = prefill(fm.fm, ids, new_cache(fm.fm))
    first, out, reason = logits_sha256(logits), [], "length"
    for step in range(max_new_tokens):
        tok = _pick(logits[0], strategy, 0.7, 0.95, gen)
        if tok == fm.fm.tokenizer.eos_token_id:
            reason = "eos"
            break
        out.append(tok)
        if any(s in fm.decode(out) for s in stop):
            reason = "stop"
            break
        if step + 1 < max_new_tokens:
            logits = forward(fm.fm, [tok], cache)[:, -1, :]
    return out, reason, first


LONG = "Problem: what is the sum of the first forty primes? Think."  # 59 tokens: past the window of 16


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("stop", [[], ["e"]])
def test_a_batch_of_one_is_the_batch_size_one_loop_bit_for_bit(fm, strategy, seed, stop):
    ids = fm.encode(LONG)
    (g,) = generate_batch(fm, ids, 1, [seed], Sampling(20, stop=tuple(stop), strategy=strategy))
    assert (g.token_ids, g.stop_reason, g.first_logits_sha256) == _one_at_a_time(fm, ids, 20, stop, strategy, seed)
    assert g.seed == (seed if strategy == "sample" else None)
    single = generate(fm, ids, max_new_tokens=20, stop=stop, strategy=strategy, seed=seed)
    assert (single.token_ids, single.text) == (g.token_ids, g.text)


def test_the_same_batch_and_seeds_reproduce_identical_rows(fm):
    ids = fm.encode(LONG)
    a = generate_batch(fm, ids, 5, [3, 1, 4, 1, 5], Sampling(24, stop=("a",), strategy="sample", temperature=1.0))
    b = generate_batch(fm, ids, 5, [3, 1, 4, 1, 5], Sampling(24, stop=("a",), strategy="sample", temperature=1.0))
    assert [(g.token_ids, g.text, g.stop_reason, g.seed) for g in a] == [
        (g.token_ids, g.text, g.stop_reason, g.seed) for g in b
    ]
    assert a[1].token_ids == a[3].token_ids  # same seed, same row
    assert len({tuple(g.token_ids) for g in a}) > 2  # seeds do differ
    assert len({g.first_logits_sha256 for g in a}) == 1  # one shared prefill


def test_greedy_rows_of_an_expanded_sliding_window_cache_decode_like_one_row(fm):
    """The context (59 tokens) is past the sliding window (16): an expansion that lost the window's state
    (its `cumulative_length`, its last window-1 positions) would decode differently from batch size 1."""
    ids = fm.encode(LONG)
    one = generate(fm, ids, max_new_tokens=30)
    rows = generate_batch(fm, ids, 3, None, Sampling(30, strategy="greedy"))
    assert [g.token_ids for g in rows] == [one.token_ids] * 3


@pytest.fixture()
def fm_two_eos():
    fm = load_backend("transformers", source="tiny-gemma3")
    fm.fm.model.config.eos_token_id = [1, 100]  # a frequent second EOS so some rows end on it
    return fm


def test_each_row_stops_at_its_own_eos_stop_string_or_budget_and_then_costs_nothing(fm_two_eos):
    fm = fm_two_eos
    ids = fm.encode(LONG)
    batch_sizes = []
    hook = fm.fm.model.register_forward_pre_hook(
        lambda _m, _a, kw: batch_sizes.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        rows = generate_batch(fm, ids, 8, range(8), Sampling(30, stop=("a", "b"), strategy="sample", temperature=1.5))
    finally:
        hook.remove()
    assert {g.stop_reason for g in rows} == {"eos", "stop", "length"}
    for g in rows:
        text = fm.decode(g.token_ids)
        if g.stop_reason == "length":
            assert len(g.token_ids) == g.decode_tokens == 30 and g.text == text
        elif g.stop_reason == "stop":
            assert "a" in text or "b" in text
            assert not any(s in fm.decode(g.token_ids[:-1]) for s in ("a", "b"))
            assert g.decode_tokens == len(g.token_ids) < 30
        else:
            assert g.decode_tokens == len(g.token_ids) + 1 <= 30
            assert g.text == text and "a" not in text and "b" not in text
    decode_calls = batch_sizes[1:]  # the first call is the shared prefill (batch 1)
    assert batch_sizes[0] == 1 and decode_calls == sorted(decode_calls, reverse=True)
    # a row that chose k tokens was fed k-1 of them back: nothing more is computed for it
    assert sum(decode_calls) == sum(g.decode_tokens - 1 for g in rows)


def test_a_grafted_context_is_shared_by_the_whole_batch(fm):
    ids = fm.encode(LONG)
    cache = fm.graft(fm.deposit(ids[:40]), token_ids=ids)
    grafted = generate_batch(fm, ids, 4, range(4), Sampling(16, strategy="sample"), cache=cache)
    fresh, _ = prefill(fm.fm, ids[:40], new_cache(fm.fm))
    plain = generate_batch(fm, ids, 4, range(4), Sampling(16, strategy="sample"), cache=fresh)
    assert all(g.prefill_tokens == len(ids) - 40 for g in grafted)
    assert [g.token_ids for g in grafted] == [g.token_ids for g in plain]
    assert grafted[0].first_logits_sha256 == plain[0].first_logits_sha256


def test_progress_is_reported_in_tokens(fm):
    counts = []
    rows = generate_batch(fm, fm.encode(LONG), 3, range(3), Sampling(10, strategy="sample"), on_token=counts.append)
    assert sum(counts) == sum(g.decode_tokens for g in rows)


def test_a_batch_needs_one_seed_per_row(fm):
    with pytest.raises(ConfigError, match="one seed per row"):
        generate_batch(fm, fm.encode("a"), 3, [1, 2], Sampling(2, strategy="sample"))


@pytest.mark.parametrize("ties", ["none", "bf16", "integers"])
def test_the_nucleus_from_the_top_candidates_is_the_full_sort_nucleus_bit_for_bit(ties, monkeypatch):
    from harness.run import decode

    fallbacks = []
    by_sort = decode._nucleus_by_sort
    monkeypatch.setattr(decode, "_nucleus_by_sort", lambda p, t: fallbacks.append(1) or by_sort(p, t))
    gen = torch.Generator().manual_seed(1)
    cases = 0
    for vocab in (300, 5000, 262144):
        for scale in (0.5, 3.0, 8.0):
            x = torch.randn(vocab, generator=gen) * scale
            x = {"none": x, "bf16": x.bfloat16().float(), "integers": x.round()}[ties]
            for temperature in (0.7, 1.0):
                for top_p in (0.5, 0.95, 0.999):
                    p = torch.softmax(x.double() / temperature, -1)
                    fast = decode._nucleus(p, top_p)
                    assert torch.equal(fast.view(torch.int64), by_sort(p, top_p).view(torch.int64))
                    cases += 1
    assert len(fallbacks) < cases  # the shortcut is taken, not only the fallback


def test_a_long_budget_keeps_only_the_window_in_sliding_layers(fm):
    """Past the window, sliding layers hold window-1 positions however long the budget; only the full
    attention layers grow (one position per token fed back)."""
    ids = fm.encode("x")
    cache = new_cache(fm.fm)
    g = generate(fm, ids, max_new_tokens=120, cache=cache, eos=set())
    assert (g.stop_reason, len(g.token_ids)) == ("length", 120)
    for layer, spec in zip(cache.layers, fm.fm.layer_layout):
        kept = layer.keys.shape[-2]
        assert kept == (spec["window"] - 1 if spec["kind"] == "sliding" else len(ids) + 119)


def test_a_cache_decoded_into_stays_usable_outside_inference_mode(fm):
    ids = fm.encode(LONG)
    cache = new_cache(fm.fm)
    g = generate(fm, ids, max_new_tokens=5, cache=cache, eos=set())
    logits = forward(fm.fm, [g.token_ids[-1]], cache)  # a further step, as a caller might take
    assert logits.shape[:2] == (1, 1) and cache.get_seq_length() == len(ids) + 5


# ---- the scripted fake backend: decoding's plumbing without model weights (kvstore.backends.fake) ----
from kvstore.backends.fake import EOS, FakeBackend  # noqa: E402


@pytest.fixture()
def fake():
    return FakeBackend({"Final answer:": " 42\n\nThe end", "Hello": " world"})


def test_the_fake_backend_types_its_script_and_stops_at_the_stop_string(fake):
    g = generate(fake, fake.encode("Problem: 6*7?\nFinal answer:"), max_new_tokens=32, stop=["\n\n"])
    assert g.text == " 42" and g.stop_reason == "stop" and fake.decode(g.token_ids) == " 42\n\n"
    assert g.decode_tokens == len(g.token_ids) == 5 and g.prefill_tokens == len(fake.encode("Problem: 6*7?\nFinal answer:"))


def test_the_fake_backend_ends_its_script_with_eos_and_counts_the_eos_as_decoded(fake):
    g = generate(fake, fake.encode("Hello"), max_new_tokens=32)
    assert g.text == " world" and g.stop_reason == "eos" and EOS not in g.token_ids
    assert g.decode_tokens == len(" world") + 1


def test_the_budget_ends_a_fake_generation_with_length(fake):
    g = generate(fake, fake.encode("Final answer:"), max_new_tokens=3, stop=["\n\n"])
    assert g.text == " 42" and g.stop_reason == "length" and g.decode_tokens == 3


def test_a_grafted_fake_state_is_not_prefilled_again_and_decodes_like_the_fresh_context(fake):
    prefix = fake.encode("Some worked solution.\n\n")
    ids = prefix + fake.encode("Final answer:", add_bos=False)
    state, _ = fake.prefill(prefix)
    snap = fake.capture(state, prefix)
    fresh = generate(fake, ids, max_new_tokens=8, stop=["\n\n"])
    before = fake.calls["prefill_tokens"]
    grafted = generate(fake, ids, max_new_tokens=8, stop=["\n\n"], cache=fake.graft(snap, ids))
    assert fake.calls["prefill_tokens"] - before == len(ids) - len(prefix)  # only the query was computed
    assert grafted.prefill_tokens == len(ids) - len(prefix)
    assert (grafted.token_ids, grafted.first_logits_sha256) == (fresh.token_ids, fresh.first_logits_sha256)


def test_seeded_fake_batches_reproduce_and_rows_leave_the_batch_when_done():
    be = FakeBackend({"Q:": " yes"}, margin=1.0)  # a low margin: the rows really sample
    ids = be.encode("Q:")
    a = generate_batch(be, ids, 4, [0, 1, 2, 3], Sampling(6, strategy="sample", temperature=1.0, top_p=1.0))
    b = generate_batch(be, ids, 4, [0, 1, 2, 3], Sampling(6, strategy="sample", temperature=1.0, top_p=1.0))
    assert [g.token_ids for g in a] == [g.token_ids for g in b] and [g.seed for g in a] == [0, 1, 2, 3]
    assert len({tuple(g.token_ids) for g in a}) > 1
    one = generate_batch(be, ids, 1, [2], Sampling(6, strategy="sample", temperature=1.0, top_p=1.0))[0]
    assert one.token_ids == a[2].token_ids  # the fake is batch invariant: row 2 alone decodes the same
