"""The artifact format (kvstore/FORMAT.md): round trip, deterministic bytes pinned by a golden hash, and
refusal of truncated, corrupted, unknown-version bytes, without ever unpickling anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from pathlib import Path

import blake3
import pytest
import torch

from kvstore import (
    FORMAT,
    ArtifactId,
    FormatError,
    IntegrityError,
    LocalStore,
    Snapshot,
    from_bytes,
    read_metadata,
    to_bytes,
    tokens_sha256,
)
from kvstore.backends.transformers import TransformersBackend
from kvstore.format.artifact import LayerKV, content_id
from kvstore.format.framing import FORMAT_V1, FORMAT_V2

# Ids of to_bytes(hand_built()) (conftest): safetensors framing + canonical kvgraft metadata + tensors.
# If one changes, the artifact bytes changed: every stored id changes with it. That needs a new FORMAT version,
# not a new constant. Version 1 (SHA-256 of the file) is still written on request and must keep its bytes.
GOLDEN_SHA256 = "7b1322dda983bef3bb79c38120530a25c24c70d03753ff9fe2f5d701d29ae18b"  # kvgraft-kv/1
GOLDEN_BLAKE3 = "4112d297bf6acea7a1b0354539be79d0493c9305952ec709f511ef317672ea39"  # kvgraft-kv/2: BLAKE3-256 of the file


def _header(data: bytes) -> tuple[dict, int]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), 8 + n


def _flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


@pytest.fixture
def deposited(tiny_gemma3):
    """A real 40-token deposit: crosses tiny-gemma3's sliding window of 16."""
    return TransformersBackend.of(tiny_gemma3).deposit([2] + [4 + (7 * i) % 256 for i in range(39)], extra={"case": "format"})


def test_golden_bytes_of_a_hand_built_snapshot_are_pinned(hand_built):
    v1 = to_bytes(hand_built(), version=FORMAT_V1)
    assert hashlib.sha256(v1).hexdigest() == GOLDEN_SHA256 == ArtifactId.of(v1)
    v2 = to_bytes(hand_built())
    assert FORMAT == FORMAT_V2 and blake3.blake3(v2).hexdigest() == GOLDEN_BLAKE3 == ArtifactId.of(v2)
    # the two versions differ only in the format string, and both read back to the same snapshot
    assert v2 == v1.replace(FORMAT_V1.encode(), FORMAT_V2.encode())
    assert to_bytes(from_bytes(v1)) == v2


def test_content_id_hashes_v2_with_blake3_on_any_thread_count(hand_built):
    data = to_bytes(hand_built())
    assert {content_id(data, threads=n) for n in (1, 2, 4)} == {blake3.blake3(data).hexdigest()}
    assert content_id(b"not an artifact") == hashlib.sha256(b"not an artifact").hexdigest()


def test_round_trip_gives_equal_tensors_and_fields(hand_built, deposited, assert_same_snapshot):
    for snap in (hand_built({"note": "é ✓"}), deposited):
        back = from_bytes(to_bytes(snap))
        assert_same_snapshot(back, snap)
        assert to_bytes(back) == to_bytes(snap)


def test_the_same_snapshot_always_gives_the_same_bytes_and_id(deposited):
    data = to_bytes(deposited)
    assert to_bytes(deposited) == data
    cloned = dataclasses.replace(
        deposited,
        layers=[dataclasses.replace(lyr, keys=lyr.keys.clone(), values=lyr.values.clone()) for lyr in deposited.layers],
        token_ids=list(deposited.token_ids),
        determinism=dict(reversed(deposited.determinism.items())),  # insertion order must not matter
        environment=dict(reversed(deposited.environment.items())),
    )
    assert to_bytes(cloned) == data
    assert ArtifactId.of(to_bytes(cloned)) == ArtifactId.of(data)


def test_strided_tensors_serialize_like_contiguous_ones(hand_built):
    snap = hand_built()
    strided = dataclasses.replace(snap, layers=[
        dataclasses.replace(lyr, keys=lyr.keys.transpose(-1, -2).contiguous().transpose(-1, -2)) for lyr in snap.layers
    ])
    assert not strided.layers[0].keys.is_contiguous()
    assert to_bytes(strided) == to_bytes(snap)


def test_depositing_the_same_tokens_twice_gives_the_same_id(tiny_gemma3, deposited):
    again = TransformersBackend.of(tiny_gemma3).deposit(deposited.token_ids, extra={"case": "format"})
    assert ArtifactId.of(to_bytes(again)) == ArtifactId.of(to_bytes(deposited))


def test_bytes_are_safetensors_with_one_canonical_kvgraft_metadata_entry(deposited):
    data = to_bytes(deposited)
    header, start = _header(data)
    assert start % 8 == 0
    assert set(header["__metadata__"]) == {"kvgraft"}
    text = header["__metadata__"]["kvgraft"]
    meta = json.loads(text)
    assert text == json.dumps(meta, sort_keys=True, separators=(",", ":"))
    assert meta["format"] == FORMAT == "kvgraft-kv/2"
    assert meta == read_metadata(data)
    names = {k for k in header if k != "__metadata__"}
    assert names == {"token_ids"} | {f"layers.{i}.{kv}" for i in range(6) for kv in ("keys", "values")}
    assert header["token_ids"]["dtype"] == "I64" and header["token_ids"]["shape"] == [40]
    # Every tensor is hashed over its raw bytes; token ids as int64 little-endian.
    for name, entry in header.items():
        if name != "__metadata__":
            b, e = entry["data_offsets"]
            assert hashlib.sha256(data[start + b : start + e]).hexdigest() == meta["tensor_sha256"][name]
    assert meta["tokens_sha256"] == meta["tensor_sha256"]["token_ids"] == tokens_sha256(deposited.token_ids)


def test_sliding_layers_hold_the_last_window_minus_one_positions(deposited):
    meta = read_metadata(to_bytes(deposited))
    assert [(lyr["kind"], lyr["window"]) for lyr in meta["layers"]] == [("sliding", 16), ("sliding", 16),
                                                                         ("full", None)] * 2
    for lyr in meta["layers"]:
        assert lyr["cumulative_length"] == 40
        assert lyr["shape"][-2] == (min(40, 16 - 1) if lyr["kind"] == "sliding" else 40)
        assert lyr["dtype"] == "float32"


@pytest.mark.parametrize("keep", [0, 7, 8, 100, "half", "all-but-one"])
def test_truncated_bytes_are_refused(hand_built, keep):
    data = to_bytes(hand_built())
    n = {"half": len(data) // 2, "all-but-one": len(data) - 1}.get(keep, keep)
    with pytest.raises((FormatError, IntegrityError)):
        from_bytes(data[:n])


def test_trailing_bytes_are_refused(hand_built):
    with pytest.raises((FormatError, IntegrityError)):
        from_bytes(to_bytes(hand_built()) + b"\0" * 8)


def test_an_unknown_format_version_is_refused_by_name(hand_built):
    data = to_bytes(hand_built())
    assert data.count(b"kvgraft-kv/2") == 1
    future = data.replace(b"kvgraft-kv/2", b"kvgraft-kv/9")  # same length: the header stays well-formed
    with pytest.raises(FormatError, match="kvgraft-kv/9"):
        read_metadata(future)
    with pytest.raises(FormatError, match="kvgraft-kv/9"):
        from_bytes(future)


def test_bytes_that_are_not_an_artifact_are_a_format_error():
    from safetensors.torch import save

    plain = save({"x": torch.zeros(2)})
    with pytest.raises(FormatError, match="kvgraft"):
        from_bytes(plain)
    with pytest.raises(FormatError):
        from_bytes(b"\xff" * 64)


@pytest.mark.parametrize("meta", ['"kvgraft-kv/1"', "[1]", '{"format": "kvgraft-kv/1"}'])
def test_metadata_that_is_not_a_complete_object_is_a_format_error(meta):
    from safetensors.torch import save

    data = save({"token_ids": torch.zeros(2, dtype=torch.int64)}, metadata={"kvgraft": meta})
    with pytest.raises(FormatError):
        read_metadata(data)
    with pytest.raises(FormatError):
        from_bytes(data)


@pytest.mark.parametrize("name", ["layers.0.keys", "layers.1.values", "token_ids"])
def test_a_flipped_byte_in_a_tensor_is_an_integrity_error_naming_it(hand_built, name):
    data = to_bytes(hand_built())
    header, start = _header(data)
    b, _ = header[name]["data_offsets"]
    with pytest.raises(IntegrityError, match=name):
        from_bytes(_flip(data, start + b + 1))


def test_loading_never_unpickles(monkeypatch, hand_built, tmp_path, assert_same_snapshot):
    def forbidden(*args, **kwargs):
        raise AssertionError("an artifact load reached pickle / torch.load")

    snap = hand_built()
    store = LocalStore(tmp_path)
    aid = store.put(snap)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    assert_same_snapshot(from_bytes(to_bytes(snap)), snap)
    assert_same_snapshot(store.get(aid), snap)


def test_kvstore_source_never_imports_pickle_or_calls_torch_load():
    import kvstore

    for path in sorted(Path(kvstore.__file__).parent.glob("*.py")):
        text = path.read_text()
        assert "import pickle" not in text and "torch.load(" not in text, path.name


def test_bfloat16_tensors_are_stored_untouched_with_their_shape_and_dtype_recorded():
    k = torch.linspace(-3, 3, 24).reshape(1, 2, 3, 4).to(torch.bfloat16)  # (batch, kv_heads, seq, head_dim)
    snap = Snapshot(token_ids=[2, 4, 5], start_position=0, layers=[LayerKV("full", None, 3, k, k * 2)],
                    model_fingerprint="c" * 64, tokenizer_fingerprint="d" * 64, dtype="bfloat16",
                    determinism={"threads": 2, "deterministic_algorithms": True, "attn_implementation": "sdpa",
                                 "dtype": "bfloat16", "prefill_chunk": 512}, environment={})
    data = to_bytes(snap)
    header, start = _header(data)
    assert header["layers.0.keys"]["dtype"] == "BF16"
    b, e = header["layers.0.keys"]["data_offsets"]
    assert data[start + b : start + e] == k.view(torch.uint8).numpy().tobytes()
    assert read_metadata(data)["layers"] == [{"kind": "full", "window": None, "cumulative_length": 3,
                                              "shape": [1, 2, 3, 4], "dtype": "bfloat16"}]
    back = from_bytes(data)
    assert back.layers[0].keys.dtype == torch.bfloat16 and torch.equal(back.layers[0].values, k * 2)
