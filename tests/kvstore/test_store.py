"""The content-addressed store: LocalStore and its in-memory twin behave the same; ids map to paths by a pure
function and back; writes are atomic; the SQLite index outlives the process; gc repairs the index."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sqlite3
import subprocess
import sys
import threading

import blake3
import pytest

from kvstore import (
    ArtifactId,
    FormatError,
    IntegrityError,
    InvalidIdError,
    LocalStore,
    MemoryStore,
    NotFoundError,
    to_bytes,
    tokens_sha256,
)
from kvstore.format.framing import FORMAT_V1, FORMAT_V2
from kvstore.format.ids import id_to_relpath, relpath_to_id

MISSING = "f" * 64


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    return LocalStore(tmp_path / "store") if request.param == "local" else MemoryStore()


@pytest.fixture
def snapshots(hand_built):
    """Three distinct snapshots; the first two share their token ids (they differ only in `extra`)."""
    a = hand_built({"n": 1})
    b = hand_built({"n": 2})
    c = dataclasses.replace(hand_built(), token_ids=[2, 9, 9, 9, 9])
    return a, b, c


def _corrupt(store, aid: str) -> None:
    if isinstance(store, LocalStore):
        path = store.path(aid)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        data = bytearray(store._data[aid])
        data[-1] ^= 0xFF
        store._data[aid] = bytes(data)


def _files_under(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_put_returns_the_content_id_of_the_bytes_and_get_returns_the_snapshot(store, hand_built,
                                                                              assert_same_snapshot):
    snap = hand_built()
    aid = store.put(snap)
    assert aid == ArtifactId.of(to_bytes(snap)) == blake3.blake3(to_bytes(snap)).hexdigest()  # kvgraft-kv/2
    assert store.get_bytes(aid) == to_bytes(snap)
    assert_same_snapshot(store.get(aid), snap)
    assert aid in store and store.contains(aid)


def test_put_is_idempotent_and_merges_tags(store, hand_built):
    first = store.put(hand_built(), tags=["a", "shared"])
    again = store.put(hand_built(), tags=["b", "shared"])
    assert first == again
    assert len(store) == 1
    assert store.info(first).tags == ("a", "b", "shared")


def test_add_tags_tags_a_stored_artifact_and_refuses_an_unknown_one(store, hand_built):
    aid = store.put(hand_built(), tags=["a"])
    store.add_tags(aid, ["b", "a"])
    assert store.info(aid).tags == ("a", "b")
    assert [i.id for i in store.list(tag="b")] == [aid]
    with pytest.raises(NotFoundError):
        store.add_tags("0" * 64, ["x"])


def test_get_of_an_unknown_id_raises_not_found_never_none(store):
    for call in (store.get, store.get_bytes, store.info, store.remove):
        with pytest.raises(NotFoundError, match=MISSING):
            call(MISSING)
    assert MISSING not in store


@pytest.mark.parametrize("bad", ["", "abc", "F" * 64, "0" * 63, "0" * 65, "g" * 64, "../" + "0" * 61])
def test_an_invalid_id_is_an_invalid_id_error(store, bad):
    with pytest.raises(InvalidIdError):
        store.get(bad)
    with pytest.raises(InvalidIdError):
        ArtifactId(bad)


def test_bytes_that_are_not_an_artifact_are_never_stored(store):
    with pytest.raises(FormatError):
        store.put_bytes(b"not an artifact at all")
    assert store.list() == []


def test_bytes_whose_tensors_do_not_match_their_recorded_hashes_never_enter_the_store(store, hand_built):
    data = bytearray(to_bytes(hand_built()))
    data[-1] ^= 0xFF  # the last byte of the last tensor: a new, self-consistent id, but a wrong tensor hash
    with pytest.raises(IntegrityError):
        store.put_bytes(bytes(data))
    assert store.list() == []


def test_list_filters_by_tag_and_find_tokens_finds_every_artifact_of_a_sequence(store, snapshots):
    a, b, c = snapshots
    ida, idb, idc = store.put(a, tags=["lib"]), store.put(b), store.put(c, tags=["lib", "other"])
    assert [i.id for i in store.list()] == sorted([ida, idb, idc])
    assert [i.id for i in store.list(tag="lib")] == sorted([ida, idc])
    assert [i.id for i in store.list(tag="other")] == [idc]
    assert store.list(tag="nope") == []
    assert store.find_tokens(tokens_sha256(a.token_ids)) == sorted([ida, idb])
    assert store.find_tokens(tokens_sha256(c.token_ids)) == [idc]
    assert store.find_tokens(tokens_sha256([1, 2, 3])) == []
    assert sorted(store) == sorted([ida, idb, idc])


def test_info_describes_an_artifact_without_reading_its_tensors(store, hand_built):
    snap = hand_built()
    aid = store.put(snap, tags=["x"])
    info = store.info(aid)
    assert (info.id, info.size, info.token_count) == (aid, len(to_bytes(snap)), 5)
    assert (info.tokens_sha256, info.model_fingerprint, info.model_name) == (
        tokens_sha256(snap.token_ids), "a" * 64, "golden")
    assert info.tags == ("x",)


def test_remove_deletes_the_artifact_and_its_index_entry(store, snapshots):
    a, b, _ = snapshots
    ida, idb = store.put(a, tags=["t"]), store.put(b)
    store.remove(ida)
    assert ida not in store
    assert [i.id for i in store.list()] == [idb]
    assert store.list(tag="t") == []
    with pytest.raises(NotFoundError):
        store.get(ida)
    with pytest.raises(NotFoundError):
        store.remove(ida)


def test_corrupted_bytes_are_an_integrity_error_on_get_and_verify(store, hand_built):
    aid = store.put(hand_built())
    _corrupt(store, aid)
    with pytest.raises(IntegrityError, match=aid):
        store.get(aid)
    with pytest.raises(IntegrityError):
        store.verify(aid)


@pytest.mark.parametrize("version", [FORMAT_V1, FORMAT_V2])
def test_a_flipped_byte_anywhere_is_refused_by_the_mapped_read_before_any_tensor(tmp_path, hand_built, version,
                                                                                  monkeypatch):
    """LocalStore.get maps the file and hashes it (BLAKE3 on several threads for v2, SHA-256 for v1)."""
    import kvstore.format.artifact as fmt

    monkeypatch.setattr(fmt, "PARALLEL_HASH_MIN", 0)  # the threaded hash even for this small file
    store = LocalStore(tmp_path / "s")
    data = to_bytes(hand_built(), version=version)
    aid = store.put_bytes(data)
    assert aid == (hashlib.sha256(data) if version == FORMAT_V1 else blake3.blake3(data)).hexdigest()
    assert fmt.content_id(data, threads=4) == aid
    n = int.from_bytes(data[:8], "little")
    path = store.path(aid)
    for offset in (0, 9, 8 + n // 2, 8 + n - 1, 8 + n, len(data) // 2, len(data) - 1):  # framing .. last tensor
        bad = bytearray(data)
        bad[offset] ^= 0x10
        path.chmod(0o644)
        path.write_bytes(bytes(bad))
        with pytest.raises(IntegrityError, match=aid):
            store.get(aid)
    path.write_bytes(data)
    snap = store.get(aid)
    assert to_bytes(snap, version=version) == data and snap.layers[0].keys.is_contiguous()


def test_a_mapped_snapshot_is_copy_on_write_and_never_writes_the_object(tmp_path, hand_built):
    store = LocalStore(tmp_path / "s")
    aid = store.put(hand_built())
    before = store.path(aid).read_bytes()
    snap = store.get(aid)
    snap.layers[0].keys.add_(1.0)  # a caller that writes into its tensors
    assert store.path(aid).read_bytes() == before
    store.verify(aid)


def test_a_private_get_is_checked_and_keeps_its_bytes_when_the_file_changes_later(tmp_path, hand_built):
    store = LocalStore(tmp_path / "s")
    aid = store.put(hand_built())
    path = store.path(aid)
    good = path.read_bytes()
    snap = store.get(aid, private=True)
    bad = bytearray(good)
    bad[-1] ^= 0x01
    with open(path, "r+b") as f:  # an in-place edit (kvgraft never does this; FORMAT.md 4)
        f.write(bytes(bad))
    assert to_bytes(snap) == good  # its own buffer: the verified bytes
    with pytest.raises(IntegrityError, match=aid):
        store.get(aid, private=True)


def test_the_parallel_tensor_verify_refuses_a_flipped_tensor_byte(hand_built, monkeypatch):
    import kvstore.format.artifact as fmt

    monkeypatch.setattr(fmt, "PARALLEL_HASH_MIN", 0)
    monkeypatch.setattr(fmt, "hash_threads", lambda: 3)
    calls = []
    real = fmt._sha
    monkeypatch.setattr(fmt, "_sha", lambda t: calls.append(threading.current_thread().name) or real(t))
    data = to_bytes(hand_built())
    fmt.from_bytes(data, verify_tensors=True)
    assert any(name.startswith("kvgraft-verify") for name in calls)
    bad = bytearray(data)
    bad[-1] ^= 0x01
    with pytest.raises(IntegrityError, match="does not match its recorded SHA-256"):
        fmt.from_bytes(bytes(bad), verify_tensors=True)


def test_id_to_relpath_and_relpath_to_id_are_inverse():
    aid = ArtifactId.of(b"some bytes")
    rel = id_to_relpath(aid)
    assert rel == f"objects/{aid[:2]}/{aid[2:]}"
    assert relpath_to_id(rel) == aid


@pytest.mark.parametrize("rel", [
    "objects/ab",
    "objects/ab/" + "c" * 61,
    "objects/ab/" + "c" * 62 + "/x",
    "blobs/ab/" + "c" * 62,
    "objects/abc/" + "c" * 61,
    "objects/AB/" + "C" * 62,
    "/objects/ab/" + "c" * 62,
    "objects/ab/" + "g" * 62,
    "objects/ab/." + "c" * 61,
])
def test_relpath_to_id_rejects_anything_but_an_object_path(rel):
    with pytest.raises(InvalidIdError):
        relpath_to_id(rel)


@pytest.mark.parametrize("crash_in", ["fsync", "replace"])
def test_an_interrupted_write_leaves_nothing_visible(tmp_path, hand_built, monkeypatch, crash_in):
    store = LocalStore(tmp_path / "store")

    def crash(*args, **kwargs):
        raise OSError(f"simulated crash in os.{crash_in}")

    monkeypatch.setattr(os, crash_in, crash)
    with pytest.raises(OSError, match="simulated crash"):
        store.put(hand_built())
    monkeypatch.undo()
    assert [f for f in _files_under(store.root) if f.startswith("objects")] == []
    assert store.list() == [] and len(store) == 0
    aid = ArtifactId.of(to_bytes(hand_built()))
    assert not store.contains(aid)
    assert store.put(hand_built()) == aid  # and the next write succeeds


def test_the_index_survives_a_new_process(tmp_path, snapshots):
    store = LocalStore(tmp_path / "store")
    ids = sorted(store.put(s, tags=["kept"]) for s in snapshots)
    script = "import sys; from kvstore import LocalStore; print(*[i.id for i in LocalStore(sys.argv[1]).list('kept')])"
    out = subprocess.run([sys.executable, "-c", script, str(store.root)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ids


def test_gc_reindexes_objects_without_rows_and_drops_rows_without_objects(tmp_path, snapshots):
    store = LocalStore(tmp_path / "store")
    a, b, c = snapshots
    ida, idb, idc = store.put(a), store.put(b), store.put(c)
    with sqlite3.connect(store.index_path) as db:  # a crash between the object write and its index row
        db.execute("DELETE FROM artifacts WHERE id = ?", (ida,))
    store.path(idb).unlink()  # an object lost behind the index's back
    temp = store.path(idc).parent / f".{idc[2:]}.x.tmp"  # a leftover of an interrupted write
    temp.write_bytes(b"partial")
    os.utime(temp, (temp.stat().st_atime - 7200, temp.stat().st_mtime - 7200))  # older than the 1 h grace period
    assert sorted(i.id for i in store.list()) == sorted([idb, idc])

    report = store.gc()

    assert report == {"temp_removed": 1, "temp_kept": 0, "rows_dropped": 1, "rows_repaired": [], "objects_indexed": 1, "damaged": []}
    assert sorted(i.id for i in store.list()) == sorted([ida, idc])
    assert not temp.exists()
    assert store.info(ida).token_count == 5
    assert store.gc() == {"temp_removed": 0, "temp_kept": 0, "rows_dropped": 0, "rows_repaired": [], "objects_indexed": 0, "damaged": []}


def test_gc_reports_a_damaged_unindexed_object_and_keeps_it(tmp_path, hand_built):
    store = LocalStore(tmp_path / "store")
    aid = store.put(hand_built())
    with sqlite3.connect(store.index_path) as db:
        db.execute("DELETE FROM artifacts WHERE id = ?", (aid,))
    _corrupt(store, aid)
    report = store.gc()
    assert report["objects_indexed"] == 0 and len(report["damaged"]) == 1 and aid in report["damaged"][0]
    assert store.path(aid).exists()
