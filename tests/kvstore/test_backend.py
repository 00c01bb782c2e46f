"""The backend seam (kvstore.engine.protocol): a FrozenModel has one transformers backend with the engine's own bits,
every backend satisfies the protocol, check_graft runs on any of them, and artifacts name their backend."""

from __future__ import annotations

import pytest

from kvstore import LocalStore, check_graft, load_backend, logits_sha256
from kvstore.backends.fake import FakeBackend
from kvstore.backends.transformers import forward, load_frozen_model, prefill
from kvstore.backends.transformers.backend import TransformersBackend
from kvstore.engine.protocol import Backend, artifact_backend
from kvstore.errors import IncompatibleError, ModelLoadError


@pytest.fixture(scope="module")
def fm():
    return load_frozen_model("tiny-gemma3")


def test_a_frozen_model_has_one_transformers_backend(fm):
    be = TransformersBackend.of(fm)
    assert isinstance(be, TransformersBackend) and isinstance(be, Backend) and TransformersBackend.of(fm) is be
    assert TransformersBackend.of(be) is be and be.fingerprint == fm.fingerprint and be.settings() == fm.determinism.to_dict()


def test_the_transformers_backend_computes_the_engines_own_bits(fm):
    be = TransformersBackend.of(fm)
    ids = fm.encode("a prefix longer than the tiny window of sixteen tokens, " * 2)
    cache, last = prefill(fm, ids)
    state, last_be = be.prefill(ids)
    assert logits_sha256(last) == logits_sha256(last_be)
    assert logits_sha256(forward(fm, ids[:3], cache)) == logits_sha256(be.forward(ids[:3], state))


def test_transformers_artifacts_record_no_backend_and_read_as_transformers(fm):
    be = TransformersBackend.of(fm)
    ids = fm.encode("hello there")
    snap = be.capture(be.prefill(ids)[0], ids)
    assert "backend" not in snap.determinism and artifact_backend(snap) == "transformers"


@pytest.mark.parametrize("make", [lambda fm: TransformersBackend.of(fm), lambda fm: FakeBackend({"x": "yz"})])
def test_check_graft_is_exact_on_every_backend(fm, make, tmp_path):
    be = make(fm)
    assert isinstance(be, Backend)
    c = check_graft(be, be.encode("some prefix text " * 3), be.encode(" and more", add_bos=False),
                    store=LocalStore(tmp_path))
    assert c.equal and c.kl_max == 0.0 and c.argmax_agreement == 1.0


def test_a_fake_artifact_is_refused_by_the_transformers_backend_naming_both(fm):
    fake = FakeBackend()
    ids = fake.encode("abc")
    snap = fake.capture(fake.prefill(ids)[0], ids)
    with pytest.raises(IncompatibleError, match="deposited by the fake backend, this is the transformers backend"):
        TransformersBackend.of(fm).graft(snap)


def test_an_unknown_backend_name_is_a_model_load_error_naming_the_choices():
    with pytest.raises(ModelLoadError, match=r"backend 'nosuch' is not one of \['transformers', .*'fake'.*\]"):
        load_backend("nosuch")
    with pytest.raises(IncompatibleError, match="is not a transformers model"):
        TransformersBackend.of(object())
