"""The graft admission is written once (kvstore/engine/admission.py) and every backend runs it: an artifact whose
recorded fact was changed is refused on each backend with the same one line naming that fact, before a byte
reaches the engine. Backends come from the registry (kvstore.load_backend), as a user gets them."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from kvstore import Determinism, IncompatibleError, backend_names, load_backend

TEXT = "Problem: how many ordered pairs of positive integers have product 2024? Solution: count the divisors."
OTHER = {"fake": "transformers", "transformers": "fake", "llamacpp": "fake"}


def _settings(name: str) -> dict:
    if name == "transformers":
        return {"source": "tiny-gemma3", "determinism": Determinism()}
    if name == "llamacpp":
        return {"n_ctx": 512, "n_batch": 64, "n_ubatch": 64, "threads": 1}
    return {"script": {"Solution:": " 42"}}


@pytest.fixture(scope="module", params=["fake", "transformers", "llamacpp"])
def deposited(request):
    name = request.param
    if name == "llamacpp" and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (make setup builds it)")
    be = load_backend(name, **_settings(name))
    ids = be.encode(TEXT)
    state, _ = be.prefill(ids)
    yield be, ids, be.capture(state, ids)
    close = getattr(be, "close", None)
    if close:
        close()


def _changed(be, snap, fact: str):
    """(the snapshot with `fact` changed, the context to graft it onto, the refusal that names the fact)"""
    det, env, ids = dict(snap.determinism), dict(snap.environment), list(snap.token_ids)
    if fact == "backend":
        other = OTHER[be.name]
        return (dataclasses.replace(snap, determinism={**det, "backend": other}), ids,
                rf"deposited by the {other} backend, this is the {be.name} backend")
    if fact == "model":
        return (dataclasses.replace(snap, model_fingerprint="0" * 64), ids,
                r"model fingerprint 000000000000 differs from the loaded model's")
    if fact == "tokenizer":
        return (dataclasses.replace(snap, tokenizer_fingerprint="1" * 64), ids,
                r"tokenizer fingerprint 111111111111 differs from the loaded tokenizer's")
    if fact == "dtype":
        other = "bfloat16" if snap.dtype != "bfloat16" else "float32"
        return (dataclasses.replace(snap, dtype=other), ids,
                rf"artifact dtype {other} differs from the model's {snap.dtype}")
    if fact == "setting":
        threads = det.get("threads", 1)
        return (dataclasses.replace(snap, determinism={**det, "threads": threads + 7}), ids,
                rf"other settings than this process uses.*determinism.threads: artifact {threads + 7}, this process")
    if fact == "environment":
        return (dataclasses.replace(snap, environment={**env, "torch": "0.0.0"}), ids,
                r"another compute environment.*environment.torch: artifact '0.0.0'")
    if fact == "vocabulary":
        big = [*ids[:-1], be.vocab_size() + 5]
        return (dataclasses.replace(snap, token_ids=big), big,
                rf"token id {be.vocab_size() + 5} is outside the model's vocabulary")
    if fact == "prefix":
        context = [*ids[:3], ids[3] + 1, *ids[4:]]
        return snap, context, r"the context's token ids do not begin with the artifact's \d+ tokens \(first difference "\
                              r"at index 3\)"
    raise AssertionError(fact)


FACTS = ("backend", "model", "tokenizer", "dtype", "setting", "environment", "vocabulary", "prefix")


def test_every_registered_backend_is_covered_here():
    assert set(backend_names()) <= {"fake", "transformers", "llamacpp", "vllm"}


def test_the_unchanged_artifact_grafts(deposited):
    be, ids, snap = deposited
    be.graft(snap, ids)


@pytest.mark.parametrize("fact", FACTS)
def test_a_changed_fact_is_refused_in_one_line_naming_it(deposited, fact):
    be, _, snap = deposited
    changed, context, says = _changed(be, snap, fact)
    with pytest.raises(IncompatibleError, match=says) as info:
        be.graft(changed, context)
    assert "\n" not in str(info.value)
