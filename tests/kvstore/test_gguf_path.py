"""A GGUF given by path to the transformers backend (`model.source=<file.gguf>`): converted once into the verified
model cache (kvstore/backends/transformers/gguf.py), the same model as the packaged name, and a damaged cache is
converted again, never loaded."""

from __future__ import annotations

import shutil

import pytest

from kvstore import Determinism, ModelLoadError
from kvstore.backends.transformers import gguf
from kvstore.backends.transformers.model import load_frozen_model


def test_a_missing_gguf_path_is_refused_in_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="no such folder") as e:
        load_frozen_model(str(tmp_path / "absent.gguf"))
    assert "\n" not in str(e.value)


@pytest.mark.integration
@pytest.mark.slow
def test_the_bundled_gguf_by_path_converts_once_and_verifies(tmp_path, monkeypatch):
    from kvstore.backends.packaged import BUNDLED, gguf_path

    path = str(gguf_path(BUNDLED))
    det = Determinism()
    packaged = load_frozen_model(BUNDLED, det).fingerprint  # the packaged name, from the suite's model cache
    monkeypatch.setenv("KVGRAFT_CACHE", str(tmp_path / "cache"))  # the file's conversion, in a fresh cache
    first = load_frozen_model(path, det)
    folder = gguf.converted_gguf(det, path)
    assert folder.name.startswith("file-") and (folder / gguf.RECORD).is_file()
    assert first.fingerprint == packaged  # the same weights as the packaged name

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert", no_conversion)
    assert load_frozen_model(path, det).fingerprint == first.fingerprint  # the cache, verified, reused
    good = tmp_path / "good"
    shutil.copytree(folder, good)
    weights = next(folder.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match="converted again"):  # a damaged cache is never loaded
        load_frozen_model(path, det)
    assert not folder.exists()  # the damaged copy was put out of the way before converting again

    conversions = []

    def reconvert(gguf_file, det_, cached, want):  # the conversion above, already measured once: its output again
        conversions.append(cached)
        shutil.copytree(good, cached)

    monkeypatch.setattr(gguf, "_convert", reconvert)
    assert load_frozen_model(path, det).fingerprint == first.fingerprint
    assert conversions == [folder]  # converted again into the same folder, verified, then loaded
