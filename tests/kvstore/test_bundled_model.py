"""Integration: on the real bundled Gemma 3 270M, an artifact deposited in this process and grafted in a
separate process gives suffix logits byte-identical to the fresh reference computed here.

Slow: one model load per process (the first ever load converts the GGUF into ~/.cache/kvgraft, ~1-2 min).
Run with `pytest -m integration tests/kvstore/test_bundled_model.py`.
"""

from __future__ import annotations

import os

import pytest

from kvstore import LocalStore, check_graft, logits_sha256
from kvstore.backends.transformers import TransformersBackend, load_frozen_model
from kvstore.engine.restore_worker import ModelSpec, RestoreWorker

pytestmark = pytest.mark.integration

TEXT = ("Problem: A farmer has 17 sheep. All but 9 run away. How many sheep are left? "
        "Solution: 'All but 9' means 9 sheep stay behind, so the farmer has 9 sheep left. "
        "Answer: 9. Problem: What is the sum of the first five positive odd integers?")
SUFFIX_TEXT = " Solution: 1 + 3 + 5 + 7 + 9 = 25."


@pytest.fixture(scope="module")
def bundled():
    return load_frozen_model()


def test_an_artifact_grafted_in_another_process_gives_the_fresh_reference_logits(bundled, tmp_path):
    prefix = bundled.encode(TEXT)[:60]
    suffix = bundled.encode(SUFFIX_TEXT, add_bos=False)
    assert len(prefix) == 60 and len(suffix) >= 8
    store = LocalStore(tmp_path / "store")
    with RestoreWorker(ModelSpec.backend("transformers"), store.root) as worker:  # the bundled model, loaded there
        check = check_graft(TransformersBackend.of(bundled), prefix, suffix, store, restore=worker.restorer(prefix, suffix),
                            tags=["integration"], keep_logits=True)
        hello = worker.ready()

    assert hello["model_fingerprint"] == bundled.fingerprint and hello["pid"] != os.getpid()
    assert check.equal and logits_sha256(check.graft_logits) == check.sha256_reference
    snapshot = store.get(check.artifact_id)
    assert [lyr["kind"] for lyr in snapshot.layout].count("full") == 3  # 18 layers, every 6th full attention
    assert all(lyr.keys.shape[-2] == 60 for lyr in snapshot.layers)  # 60 < window 512: every position kept
