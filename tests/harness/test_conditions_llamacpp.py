"""The conditions on the llama.cpp backend (bundled GGUF): baseline, graft and incontext with greedy and seeded
sampling; every graft row is bit-identical to its in-context twin (same context, first-logits SHA-256, tokens).
Skipped where llama-cpp-python is not installed (`make setup` builds it)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make setup builds it)")

from harness.config.schema import DecodingConfig, PromptConfig  # noqa: E402
from harness.errors import ConfigError, HarnessError  # noqa: E402
from harness.run.conditions import Baseline, Graft, InContext  # noqa: E402
from harness.task.problems import load_problems  # noqa: E402
from kvstore import KVStoreError  # noqa: E402
from kvstore.backends.llamacpp.backend import LlamaCppBackend  # noqa: E402
from kvstore.backends.llamacpp.settings import LlamaCppSettings  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def be():
    b = LlamaCppBackend(LlamaCppSettings(n_ctx=2048))
    yield b
    b.close()


@pytest.fixture(scope="module")
def problems():
    return load_problems(str(REPO / "problems/kvgraft_original.jsonl"))[:2]


@pytest.fixture(scope="module")
def library(be, problems, tmp_path_factory, deposit_library):
    """A library of the problems' own solutions deposited by this backend (artifacts in a LocalStore)."""
    return deposit_library(be, problems, tmp_path_factory.mktemp("llamacpp-library"),
                           lambda p: f"Problem: {p.problem}\nSolution: {p.solution}\nFinal answer: {p.answer}\n\n",
                           "llamacpp-test")


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_graft_rows_on_llamacpp_are_bit_identical_to_their_incontext_twins(be, problems, library, strategy):
    d = DecodingConfig(strategy=strategy, max_new_tokens=8, n_samples=2, seed=3)
    graft, incontext = Graft(be, PromptConfig(), d, library), InContext(be, PromptConfig(), d, library)
    base = Baseline(be, PromptConfig(), d)
    for p in problems:
        for s in range(2):
            g, i, b = graft.complete(p, s), incontext.complete(p, s), base.complete(p, s)
            assert g.retrieval.match == "exact" and g.grafted_tokens > 0 and i.grafted_tokens == 0
            assert i.prefill_tokens == g.prefill_tokens + g.grafted_tokens
            assert (g.context_ids, g.token_ids, g.first_logits_sha256, g.text, g.stop_reason) == (
                i.context_ids, i.token_ids, i.first_logits_sha256, i.text, i.stop_reason)
            assert b.grafted_tokens == 0 and b.stop_reason in ("eos", "stop", "length")
            if strategy == "sample":
                assert g.seed == 3 + s


def test_a_batch_of_rows_on_llamacpp_is_refused_naming_the_setting(be, problems):
    cond = Baseline(be, PromptConfig(stop=[]), DecodingConfig(strategy="sample", max_new_tokens=4, batch_size=2))
    with pytest.raises((ConfigError, HarnessError, KVStoreError), match="decoding.batch_size=1"):
        cond.complete_samples(problems[0], [0, 1])
