"""kvstore.engine.restore_worker: the graft half run in a second process gives the fresh reference's logits, a graft it
cannot do is one error for that artifact (the worker keeps serving), and a worker that dies or loads another
model says so with the end of its log."""

from __future__ import annotations

import os

import pytest

from kvstore import LocalStore, check_graft, logits_sha256
from kvstore.backends.transformers import TransformersBackend
from kvstore.engine.restore_worker import ModelSpec, RestoreWorker
from kvstore.engine.verify import reference_logits
from kvstore.errors import RemoteGraftError, RestoreWorkerError

PREFIX = [2, *range(10, 40)]  # 31 tokens: past tiny-gemma3's sliding window of 16
SUFFIX = [50, 61, 72, 83]


def test_a_graft_in_the_second_process_equals_the_fresh_reference_and_a_miss_is_one_error(tiny_gemma3, tmp_path):
    store = LocalStore(tmp_path / "store")
    spec = ModelSpec.backend("transformers", source="tiny-gemma3", determinism=tiny_gemma3.determinism.to_dict())
    with RestoreWorker(spec, store.root) as worker:
        worker.check_model(tiny_gemma3.fingerprint)
        assert worker.ready()["pid"] != os.getpid()
        check = check_graft(TransformersBackend.of(tiny_gemma3), PREFIX, SUFFIX, store, restore=worker.restorer(PREFIX, SUFFIX))
        assert check.equal and check.sha256_graft == logits_sha256(reference_logits(TransformersBackend.of(tiny_gemma3), PREFIX, SUFFIX))
        with pytest.raises(RemoteGraftError, match="NotFoundError"):
            worker.restore("0" * 64, PREFIX, SUFFIX)
        aid = store.put(TransformersBackend.of(tiny_gemma3).deposit(PREFIX))  # still serving after the miss
        assert worker.restore(aid, PREFIX, SUFFIX).logits.shape[1] == len(SUFFIX)


def test_a_worker_with_another_model_or_a_broken_spec_is_refused_with_its_log(tiny_gemma3, tmp_path):
    with RestoreWorker(ModelSpec.backend("transformers", source="tiny-llama"), tmp_path / "s") as worker:
        with pytest.raises(RestoreWorkerError, match="another model"):
            worker.check_model(tiny_gemma3.fingerprint)
    with RestoreWorker(ModelSpec("kvstore.backends.transformers.tiny:no_such_loader"), tmp_path / "s") as worker:
        with pytest.raises(RestoreWorkerError, match="exited with status 1; its log ends:(.|\n)*no_such_loader"):
            worker.ready()
