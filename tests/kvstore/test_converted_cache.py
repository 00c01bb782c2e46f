"""The converted model cache is verified before use (issue 41, finding 6): converted.json beside the dequantized
checkpoint records the source GGUF's SHA-256, the converter's version, dtype, transformers version and every
file's SHA-256; a flipped bit in model.safetensors, an edited config, a missing record or another converter is
said in one line and the checkpoint converted again, so a damaged cache never loads as the packaged model. The
conversion itself is replaced by saving the tiny random-weight model (the real one dequantizes 1 GB for minutes);
the cache logic, the files and their hashes are the real ones."""

from __future__ import annotations

import json

import pytest

from kvstore.backends.transformers import gguf
from kvstore.backends.transformers.tiny import build_tiny
from kvstore.determinism import Determinism


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "gguf_path", lambda name: tmp_path / "source.gguf")
    calls = []

    def fake_convert(source, det, cached, want):  # the tiny model saved as the real converter saves its model
        calls.append(cached)
        model, tok = build_tiny("tiny-gemma3", det, 0)
        with gguf.atomic_directory(cached) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            gguf.write_record(tmp, want)

    monkeypatch.setattr(gguf, "_convert", fake_convert)
    return calls


def test_a_damaged_converted_checkpoint_is_converted_again(cache, capsys):
    det = Determinism()
    folder = gguf.converted_checkpoint(det)
    record = json.loads((folder / gguf.RECORD).read_text())
    assert record["source_sha256"] == gguf.expected_sha256(gguf.BUNDLED) and record["converter"] == gguf.CONVERTER
    assert "model.safetensors" in record["files"] and len(cache) == 1
    assert gguf.converted_checkpoint(det) == folder and len(cache) == 1  # verified: used as it is
    assert "kvgraft: model cache" not in capsys.readouterr().err

    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit flipped in a weight
    weights.write_bytes(bytes(data))
    assert gguf.converted_checkpoint(det) == folder and len(cache) == 2
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("kvgraft: model cache")]
    assert len(said) == 1 and "model.safetensors has SHA-256" in said[0] and "converting" in said[0]
    assert gguf.cache_problem(folder, {k: record[k] for k in ("source", "source_sha256", "converter", "dtype",
                                                               "transformers")}) is None

    (folder / gguf.RECORD).unlink()  # converted before the record existed: what made it is unknown
    gguf.converted_checkpoint(det)
    assert len(cache) == 3 and "no readable converted.json" in capsys.readouterr().err

    rec = json.loads((folder / gguf.RECORD).read_text())
    (folder / gguf.RECORD).write_text(json.dumps({**rec, "converter": "older/0"}))
    gguf.converted_checkpoint(det)
    assert len(cache) == 4 and "converter is 'older/0'" in capsys.readouterr().err
