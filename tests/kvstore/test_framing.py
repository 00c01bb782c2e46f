"""The layout memo (kvstore/format/framing.py): a header checked once is not re-checked on the next read of the same
bytes, and nothing the memo skips could let changed bytes through: a header differing in any byte or a file of
another length is checked from scratch, tensor contents are never covered, and callers get fresh metadata."""

from __future__ import annotations

import pytest

import kvstore.format.framing as framing
from kvstore import FormatError, IntegrityError, LocalStore, ValidationError, from_bytes, to_bytes


@pytest.fixture(autouse=True)
def empty_memo():
    framing.forget_layouts()
    yield
    framing.forget_layouts()


@pytest.fixture
def count_parses(monkeypatch):
    """The number of full header checks (parse_header calls) made so far."""
    calls = []
    real = framing.parse_header
    monkeypatch.setattr(framing, "parse_header", lambda data: calls.append(1) or real(data))
    return lambda: len(calls)


def _flip(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


def _start(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little")


def test_a_header_is_checked_once_and_reads_agree(hand_built, assert_same_snapshot, count_parses):
    data = to_bytes(hand_built(extra={"k": [1, 2]}))
    first = from_bytes(data)
    second = from_bytes(data)
    assert count_parses() == 1
    assert_same_snapshot(first, second)
    assert_same_snapshot(second, hand_built(extra={"k": [1, 2]}))


def test_metadata_from_a_remembered_header_is_fresh(hand_built, count_parses):
    data = to_bytes(hand_built(extra={"k": [1, 2]}))
    first = from_bytes(data)
    first.extra["k"].append(3)
    first.determinism["threads"] = 99
    second = from_bytes(data)
    assert count_parses() == 1
    assert second.extra == {"k": [1, 2]} and second.determinism["threads"] == 2


def test_a_changed_header_byte_is_checked_from_scratch_and_refused(hand_built, count_parses):
    data = to_bytes(hand_built())
    from_bytes(data)
    at = data.index(b'token_count\\":5') + len('token_count\\":')
    bad = data[:at] + b"6" + data[at + 1 :]  # same length: 6 tokens claimed, 5 stored
    with pytest.raises(ValidationError, match="token count 6"):
        from_bytes(bad)
    assert count_parses() == 2


@pytest.mark.parametrize("change", ["truncate", "pad"])
def test_the_same_header_over_a_file_of_another_length_is_refused(hand_built, change):
    data = to_bytes(hand_built())
    from_bytes(data)  # remembered
    bad = data[:-4] if change == "truncate" else data + b"\0" * 4
    with pytest.raises(FormatError, match="header describes"):
        from_bytes(bad)


def test_a_remembered_header_does_not_cover_tensor_bytes(hand_built, tmp_path):
    data = to_bytes(hand_built())
    from_bytes(data)
    bad = _flip(data, len(data) - 3)  # last value of the last tensor
    with pytest.raises(IntegrityError):
        from_bytes(bad)  # per-tensor SHA-256
    store = LocalStore(tmp_path / "store")
    aid = store.put_bytes(data)
    store.get(aid)  # header remembered through the store's path too
    store.path(aid).chmod(0o644)
    store.path(aid).write_bytes(bad)
    with pytest.raises(IntegrityError, match="bytes hash to"):
        store.get(aid)  # the file's hash, before any tensor is built


def test_a_remembered_token_ids_tensor_is_still_checked_without_the_deep_check(hand_built):
    data = to_bytes(hand_built())
    from_bytes(data, verify_tensors=False)
    bad = _flip(data, _start(data))  # first byte of token_ids
    with pytest.raises(IntegrityError, match="token_ids"):
        from_bytes(bad, verify_tensors=False)


def test_the_memo_is_bounded(hand_built, monkeypatch):
    one = len(to_bytes(hand_built())[: _start(to_bytes(hand_built()))])
    monkeypatch.setattr(framing, "MEMO_BYTES", 3 * one + 100)  # headers differ in length by a few bytes at most
    for i in range(10):
        from_bytes(to_bytes(hand_built(extra={"i": i})))
    assert len(framing._memo) <= 3 and framing._memo_bytes <= framing.MEMO_BYTES
    monkeypatch.setattr(framing, "MEMO_MAX_HEADER", 10)
    framing.forget_layouts()
    from_bytes(to_bytes(hand_built()))
    assert len(framing._memo) == 0  # larger than the limit: checked every time, never kept
