"""The byte-store contract (kvstore/store/byte_store.py) on the two byte stores that need no server: the memory one and
the folder a LocalStore writes (S3Bytes runs the same verbs in test_s3_store.py). And the one layer above them:
a LocalStore is an ObjectStore whose index is a SQLite file, so the admission and gc every store runs are the
ones it runs."""

from __future__ import annotations

import pytest

from kvstore.errors import KVStoreError, NotFoundError
from kvstore.store.byte_store import MemoryBytes
from kvstore.store.directory import DirectoryBytes
from kvstore.store.local import LocalStore
from kvstore.store.objects import ObjectStore
from kvstore.store.sqlite_index import SqliteIndex


@pytest.fixture(params=["memory", "directory"])
def blobs(request, tmp_path):
    return MemoryBytes() if request.param == "memory" else DirectoryBytes(tmp_path / "d")


def test_create_is_create_if_absent_and_get_returns_the_first_bytes(blobs):
    assert blobs.create("objects/ab/x1", b"first") is True
    assert blobs.create("objects/ab/x1", b"second") is False
    assert blobs.get("objects/ab/x1") == b"first" and bytes(blobs.map("objects/ab/x1")) == b"first"
    assert bytes(blobs.read_private("objects/ab/x1")) == b"first"


def test_missing_keys_are_not_found_and_list_is_sorted_by_prefix(blobs):
    with pytest.raises(NotFoundError):
        blobs.get("objects/zz/none")
    for key in ("objects/cd/2", "objects/ab/1", "index/a.json"):
        blobs.create(key, b"x")
    assert blobs.list("objects/") == ["objects/ab/1", "objects/cd/2"]
    assert blobs.list("objects/ab/") == ["objects/ab/1"] and blobs.list("tags/") == []
    assert blobs.contains("index/a.json") and not blobs.contains("index/b.json")
    assert blobs.delete("objects/ab/1") is True and blobs.delete("objects/ab/1") is False
    assert blobs.list("objects/") == ["objects/cd/2"]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "a b"])
def test_keys_that_are_not_relative_paths_are_refused(blobs, key):
    with pytest.raises(KVStoreError, match="byte-store key"):
        blobs.create(key, b"x")


def test_a_folders_temp_files_are_not_keys(tmp_path):
    d = DirectoryBytes(tmp_path / "d")
    d.create("objects/ab/x1", b"x")
    (tmp_path / "d" / "objects" / "ab" / ".x2.0123456789abcdef.tmp").write_bytes(b"partial")
    assert d.list("objects/") == ["objects/ab/x1"]
    assert [p.name for p in d.temp_files("objects")] == [".x2.0123456789abcdef.tmp"]


def test_a_local_store_is_an_object_store_over_a_folder_and_a_sqlite_index(tmp_path, hand_built):
    store = LocalStore(tmp_path / "s")
    assert isinstance(store, ObjectStore) and isinstance(store.blobs, DirectoryBytes)
    assert isinstance(store.index, SqliteIndex) and store.index.path == store.index_path
    aid = store.put(hand_built(), tags=["t"])
    # the same objects under another ObjectStore on the same folder and index: the same rows, the same bytes
    other = ObjectStore(DirectoryBytes(store.root), SqliteIndex(store.index_path))
    assert other.list("t") == store.list("t") and other.get_bytes(aid) == store.get_bytes(aid)
    assert store.path(aid).is_file() and other.gc() == {"rows_dropped": 0, "rows_repaired": [], "objects_indexed": 0, "damaged": []}
