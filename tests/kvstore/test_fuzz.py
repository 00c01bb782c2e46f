"""The CI fuzz (kvstore/testing/fuzz.py, run by scripts/fuzz_store.py; seeded and bounded): mutants of real artifacts from both tiny models are
admitted, read and grafted; none may graft to logits different from its original's without an error, and
every refusal must be a KVStoreError. A control run with the admission checks removed shows the fuzz does
find silent wrong grafts when they exist, so the first test can fail."""

from __future__ import annotations

import pytest

import kvstore.engine.admission
import kvstore.format.artifact
import kvstore.format.framing


@pytest.fixture(scope="module")
def fuzz_store():
    import kvstore.testing.fuzz

    return kvstore.testing.fuzz


def test_no_mutant_grafts_silently_wrong_and_every_refusal_is_a_kvstore_error(fuzz_store):
    s = fuzz_store.fuzz(3000, seed=20261130, deadline_s=90)
    assert s["mutants"] >= 300, s  # the deadline only guards a badly overloaded machine
    assert s["silent_wrong"] == 0, s["examples"].get("silent_wrong")
    assert s["foreign"] == 0, s["examples"].get("foreign")
    assert s["store_disagreement"] == 0, s["examples"].get("store_disagreement")
    # Both paths were exercised: some mutants were admitted and grafted exactly, others refused.
    assert s["admitted_exact"] > 0 and s["refused_total"] > s["admitted_exact"]
    assert {"refused_admission:FormatError", "refused_admission:ValidationError",
            "refused_graft:IncompatibleError"} <= set(s["refused"])
    assert s["gc_after"]["damaged"] == 0


@pytest.fixture
def fresh_layout_memo():
    """Headers admitted while checks are switched off must not stay remembered as checked."""
    kvstore.format.framing.forget_layouts()
    yield
    kvstore.format.framing.forget_layouts()


def test_without_the_admission_checks_the_fuzz_finds_silent_wrong_grafts(fuzz_store, monkeypatch, fresh_layout_memo):
    monkeypatch.setattr(kvstore.format.framing, "_check_meta", lambda meta: None)
    monkeypatch.setattr(kvstore.format.artifact, "check_snapshot", lambda snapshot: None)
    monkeypatch.setattr(kvstore.engine.admission, "check_snapshot", lambda snapshot: None)
    monkeypatch.setattr(kvstore.engine.admission, "settings_differences", lambda recorded, current: [])
    s = fuzz_store.fuzz(500, seed=7)
    # e.g. layer 0's cumulative_length edited: the cache then reports another length and the suffix is
    # placed at other positions; swapped shape dims fail inside the model's forward.
    assert s["silent_wrong"] > 0, s["examples"]
    assert s["foreign"] > 0, s["examples"]
