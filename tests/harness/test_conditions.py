"""Conditions built from typed config pieces on the tiny random-weight model, and the library's exclusion
rule fixed when it is opened. Plumbing only: a random model's answers are noise."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.compare.pairing import pair
from harness.config.schema import compose_config, typed
from harness.errors import ConfigError, LibraryError
from harness.library.build import build_library, open_library
from harness.record.rows import Group, Row
from harness.run.conditions import CONDITIONS, Baseline, Graft, InContext, build_condition
from harness.task.answers import score
from harness.task.problems import load_problems
from kvstore import Determinism, load_backend

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fm():
    return load_backend("transformers", source="tiny-gemma3")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conditions")
    return typed(compose_config([
        "model=tiny_gemma3", f"project_root={REPO}", "decoding.max_new_tokens=3", f"library.root={tmp}/library",
        f"library.store={tmp}/store", "tracking=off",
    ]))


@pytest.fixture(scope="module")
def problems():
    return load_problems(str(REPO / "problems/kvgraft_original.jsonl"))


@pytest.fixture(scope="module")
def built(cfg, fm):
    build_library(cfg.library, fm, REPO, progress=False)
    return cfg.library


def _condition(name, cfg, fm, library_cfg=None):
    return build_condition(name, fm, cfg.prompt, cfg.decoding, library_cfg or cfg.library, REPO)


def test_the_registry_is_the_one_place_that_knows_condition_names():
    # the three of harness/run/conditions/__init__.py, then one module per further condition (harness/run/conditions/*.py)
    assert {k: CONDITIONS[k] for k in ("baseline", "graft", "incontext")} == {
        "baseline": Baseline, "graft": Graft, "incontext": InContext}
    modules = {p.stem for p in (REPO / "harness" / "run" / "conditions").glob("*.py")} - {"__init__"}
    assert set(CONDITIONS) == {"baseline", "graft", "incontext", *modules}
    assert all(cls.name == name for name, cls in CONDITIONS.items())
    assert not Baseline.uses_library and Graft.uses_library and InContext.uses_library


def test_an_unknown_condition_is_a_config_error_naming_the_choices(cfg, fm):
    with pytest.raises(ConfigError, match=r"condition='grafted' is not one of \['baseline', 'graft', 'incontext'"):
        _condition("grafted", cfg, fm)


def test_baseline_completes_the_prompt_alone(cfg, fm, problems):
    cond = _condition("baseline", cfg, fm)
    c = cond.complete(problems[0], 0)
    assert c.grafted_tokens == 0 and c.prefill_tokens == len(c.context_ids) == len(fm.encode(c.prompt))
    assert problems[0].problem in c.prompt
    assert 1 <= c.decode_tokens <= 3 and c.retrieval is None
    assert cond.group is None
    again = cond.complete(problems[0], 0)  # greedy on a frozen model: the same completion twice (timing aside)
    assert replace(again, ttft_s=None) == replace(c, ttft_s=None)


def test_graft_recurring_grafts_the_problems_own_entry(cfg, fm, problems, built):
    cond = _condition("graft", cfg, fm, built)
    lib = cond.library
    own = {e.problem_id: e for e in lib.entries}
    c = cond.complete(problems[1], 0)
    assert c.retrieval.match == "exact" and c.retrieval.artifact_id == own[problems[1].id].artifact_id
    assert c.grafted_tokens == own[problems[1].id].tokens
    assert c.prefill_tokens == len(c.context_ids) - c.grafted_tokens
    assert cond.group is Group.RECURRING


def test_exclude_self_never_returns_the_problem_itself(cfg, fm, problems, built):
    lib = open_library(built.__class__(**{**built.__dict__, "exclude_self": True}), fm, REPO)
    assert lib.exclude_self and lib.retrieval == "bm25"
    for p in problems:
        m = lib.retrieve(p)
        assert m is not None and m.kind == "bm25"
        assert m.entry.problem_id != p.id and m.entry.problem_fingerprint != p.fingerprint
    open_lib = open_library(built, fm, REPO)
    assert all(open_lib.retrieve(p).kind == "exact" for p in problems)


def test_random_retrieval_grafts_another_entry_the_same_one_every_time(cfg, fm, problems, built):
    lib_cfg = built.__class__(**{**built.__dict__, "exclude_self": True, "retrieval": "random"})
    lib = open_library(lib_cfg, fm, REPO)
    first = {p.id: lib.retrieve(p) for p in problems}
    assert all(m.kind == "random" and m.entry.problem_id != pid for pid, m in first.items())
    again = open_library(lib_cfg, fm, REPO)
    assert {p.id: again.retrieve(p).entry.entry_id for p in problems} == {k: m.entry.entry_id for k, m in first.items()}


def test_held_out_graft_with_no_retrieval_falls_back_to_the_query_alone(cfg, fm, problems, built):
    lib_cfg = built.__class__(**{**built.__dict__, "exclude_self": True, "retrieval": "none"})
    cond = _condition("graft", cfg, fm, lib_cfg)
    c = cond.complete(problems[2], 0)
    assert c.retrieval is None and c.grafted_tokens == 0
    assert cond.group is Group.HELD_OUT  # the run's group, whatever retrieval found


def test_an_unknown_retrieval_is_refused_when_the_library_is_opened(fm, built):
    with pytest.raises(LibraryError, match="library.retrieval='dense'"):
        open_library(built.__class__(**{**built.__dict__, "retrieval": "dense"}), fm, REPO)


def _rows(cond, problems, samples):
    out = []
    for p in problems:
        for c, s in zip(cond.complete_samples(p, samples), samples, strict=True):
            out.append(Row.scored(p.id, s, cond.name, cond.group, c, p.answer, score(c.text, p.answer), wall_s=0.0,
                                  cpu_s=0.0, energy_j=None, energy_status="unavailable:test"))
    return out


@pytest.mark.parametrize("model,dtype", [("tiny-gemma3", "float32"), ("tiny-llama", "float32"),
                                         ("tiny-gemma3", "bfloat16")])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_incontext_rows_are_bit_identical_to_graft_rows(tmp_path_factory, problems, model, dtype, exclude_self):
    """The control: the entry read in context (computed fresh, deposit schedule) gives the graft's rows exactly:
    same context, same first-logits SHA-256, same completion tokens; sliding + full layers (tiny-gemma3, window
    16, entries far longer) and full-only (tiny-llama); fp32 and bf16."""
    fm = load_backend("transformers", source=model, determinism=Determinism(dtype=dtype))
    tmp = tmp_path_factory.mktemp(f"pair-{model}-{dtype}")
    c = typed(compose_config([
        "model=tiny_gemma3", f"model.source={model}", f"determinism.dtype={dtype}", f"project_root={REPO}",
        "decoding=sample", "decoding.max_new_tokens=6", "decoding.n_samples=2", f"library.root={tmp}/library",
        f"library.store={tmp}/store", "tracking=off", f"library.exclude_self={str(exclude_self).lower()}",
    ]))
    build_library(c.library, fm, REPO, progress=False)
    some = problems[:3]
    graft = _rows(_condition("graft", c, fm), some, [0, 1])
    incontext = _rows(_condition("incontext", c, fm), some, [0, 1])
    assert all(r.completion.retrieval is not None and r.completion.grafted_tokens > 16 for r in graft)
    assert all(r.completion.grafted_tokens == 0 for r in incontext)
    assert [r.completion.prefill_tokens for r in incontext] == [
        r.completion.prefill_tokens + r.completion.grafted_tokens for r in graft]
    result = pair(graft, incontext)
    assert result.ok and result.identical == 6, result.differences
    assert len({r.completion.first_logits_sha256 for r in graft}) == 3  # one context per problem, distinct


def test_batched_samples_reproduce_and_record_their_seeds(cfg, fm, problems, built):
    d = replace(cfg.decoding, strategy="sample", n_samples=4, batch_size=4, max_new_tokens=8, seed=5)
    cond = build_condition("graft", fm, cfg.prompt, d, built, REPO)
    a = cond.complete_samples(problems[0], [0, 1, 2, 3])
    b = cond.complete_samples(problems[0], [0, 1, 2, 3])
    assert [x.seed for x in a] == [5, 6, 7, 8]
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.first_logits_sha256 for x in a] == [x.first_logits_sha256 for x in b]
    assert len({tuple(x.token_ids) for x in a}) > 1  # the rows really sample with their own seeds
    assert all(x.stop_reason in ("eos", "stop", "length") for x in a)


def test_prefetched_artifacts_give_the_same_completions_as_direct_reads(cfg, fm, problems, built):
    """The graft condition reads the next problem's artifact in the background (library.prefetch_mb); what it
    hands out is what store.get returns, so every completion is the same as with prefetch off."""
    direct = _condition("graft", cfg, fm, replace(built, prefetch_mb=0))
    ahead = _condition("graft", cfg, fm, built)
    assert direct.prefetch is None and ahead.prefetch is not None
    some = problems[:4]
    got, want = [], []
    for i, p in enumerate(some):
        if i + 1 < len(some):
            ahead.upcoming(some[i + 1])
        got.append(replace(ahead.complete(p, 0), ttft_s=None))
        want.append(replace(direct.complete(p, 0), ttft_s=None))
    assert got == want
    assert ahead.prefetch.hits == 3 and ahead.prefetch.misses == 1  # the first problem had nothing ahead of it
    ahead.close()
    direct.close()


# ---- the conditions on the scripted fake backend (kvstore.backends.fake): plumbing without model weights ----
from harness.config.schema import DecodingConfig, PromptConfig  # noqa: E402
from kvstore.backends.fake import FakeBackend  # noqa: E402
from kvstore.errors import IncompatibleError  # noqa: E402


def _fake_entry(p):
    return f"Problem: {p.problem}\nSolution: the answer is {p.answer}.\n\n"


@pytest.fixture()
def fake():
    return FakeBackend({"Final answer:": " 7\n\nmore"})


def test_baseline_on_the_fake_backend_prompts_decodes_and_stops(fake, problems):
    cond = Baseline(fake, PromptConfig(), DecodingConfig(max_new_tokens=8))
    c = cond.complete(problems[0], 0)
    assert c.text == " 7" and c.stop_reason == "stop" and c.decode_tokens == 3
    assert c.prefill_tokens == len(c.context_ids) == len(fake.encode(c.prompt)) and c.grafted_tokens == 0


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_graft_rows_on_the_fake_backend_are_their_incontext_twins(fake, problems, tmp_path, strategy, deposit_library):
    lib = deposit_library(fake, problems[:3], tmp_path, _fake_entry, "fake")
    d = DecodingConfig(strategy=strategy, max_new_tokens=8, n_samples=2, temperature=1.0, top_p=1.0)
    graft, incontext = Graft(fake, PromptConfig(), d, lib), InContext(fake, PromptConfig(), d, lib)
    for p in problems[:3]:
        g, i = graft.complete_samples(p, [0, 1]), incontext.complete_samples(p, [0, 1])
        for a, b in zip(g, i, strict=True):
            assert a.retrieval.match == "exact" and a.grafted_tokens == b.prefill_tokens - a.prefill_tokens > 0
            assert (a.context_ids, a.token_ids, a.first_logits_sha256, a.text) == (
                b.context_ids, b.token_ids, b.first_logits_sha256, b.text)
    assert fake.calls["grafts"] == 3  # one graft per problem: the rows share it


def test_graft_on_the_fake_backend_refuses_an_artifact_of_another_backend(problems, tmp_path, deposit_library):
    # another script: another fingerprint
    lib = deposit_library(FakeBackend({"x": "y"}), problems[:1], tmp_path, _fake_entry, "fake")
    cond = Graft(FakeBackend({"x": "z"}), PromptConfig(), DecodingConfig(max_new_tokens=2), lib)
    with pytest.raises(IncompatibleError, match="model fingerprint .* differs from the loaded model's"):
        cond.complete(problems[0], 0)
    snap = lib.store.get(lib.entries[0].artifact_id)
    snap.determinism = {**snap.determinism, "backend": "llamacpp"}
    with pytest.raises(IncompatibleError, match="deposited by the llamacpp backend, this is the fake backend"):
        FakeBackend({"x": "y"}).graft(snap)
