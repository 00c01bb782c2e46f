"""The verified read (kvstore/store/verified_read.py): the id's hash runs on a worker thread while the header is parsed.
A byte changed anywhere in a stored file is refused with IntegrityError before any snapshot is returned, on the
overlapped path as on the serial one, also when the damage breaks the parse; a forked child reads too."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import pytest

import kvstore.store.verified_read as verified_read
from kvstore import IntegrityError, LocalStore
from kvstore.backends.transformers import TransformersBackend


@pytest.fixture(params=["overlapped", "serial"])
def path_taken(request, monkeypatch):
    monkeypatch.setattr(verified_read, "OVERLAP_MIN", 0 if request.param == "overlapped" else 1 << 40)
    parsed = []
    real = verified_read.from_bytes
    monkeypatch.setattr(verified_read, "from_bytes", lambda data, **kw: parsed.append(1) or real(data, **kw))
    return request.param, parsed


@pytest.fixture
def stored(tiny_gemma3, tmp_path):
    store = LocalStore(tmp_path / "store")
    snap = TransformersBackend.of(tiny_gemma3).deposit([2] + [4 + (5 * i) % 256 for i in range(39)])
    return store, store.put(snap), snap


def _damage(store: LocalStore, aid: str, offset: int) -> None:
    path = store.path(aid)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def test_a_clean_read_returns_the_snapshot(stored, path_taken, assert_same_snapshot):
    store, aid, snap = stored
    assert_same_snapshot(store.get(aid), snap)
    assert_same_snapshot(store.get(aid, private=True), snap)
    assert len(path_taken[1]) == 2


@pytest.mark.parametrize("where", ["length prefix", "header", "metadata", "token_ids", "first layer", "last byte"])
def test_a_changed_byte_anywhere_is_refused_before_a_snapshot_is_returned(stored, path_taken, where):
    store, aid, _ = stored
    data = store.path(aid).read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    offset = {"length prefix": 1, "header": 12, "metadata": data.index(b"start_position"),
              "token_ids": start + 3 * 8, "first layer": start + 40 * 8 + 5, "last byte": len(data) - 1}[where]
    _damage(store, aid, offset)
    for private in (False, True):
        with pytest.raises(IntegrityError, match="bytes hash to"):
            store.get(aid, private=private)
    mode, parsed = path_taken
    if mode == "overlapped":  # the parse ran alongside the hash, and still nothing came back
        assert len(parsed) == 2


def _child_reads(root: str, aid: str, out) -> None:
    try:
        LocalStore(root).get(aid)
        out.put("ok")
    except BaseException as e:  # pragma: no cover - reported to the parent
        out.put(repr(e))


def test_a_forked_child_reads_with_its_own_hashing_thread(stored, monkeypatch):
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    monkeypatch.setattr(verified_read, "OVERLAP_MIN", 0)
    store, aid, _ = stored
    store.get(aid)  # the parent's hashing thread exists now
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(str(store.root), aid, out))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and out.get(timeout=5) == "ok"


def test_reads_on_several_threads_at_once_each_get_their_own_verified_snapshot(tiny_gemma3, tmp_path, monkeypatch,
                                                                               assert_same_snapshot):
    monkeypatch.setattr(verified_read, "OVERLAP_MIN", 0)
    store = LocalStore(tmp_path / "store")
    snaps = [TransformersBackend.of(tiny_gemma3).deposit([2] + [4 + (k * i) % 256 for i in range(24)]) for k in (3, 5, 7)]
    ids = [store.put(s) for s in snaps]
    _damage(store, ids[2], store.path(ids[2]).stat().st_size - 1)

    def read(i: int):
        try:
            return store.get(ids[i % 3], private=bool(i % 2))
        except IntegrityError as e:
            return e

    with ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(read, range(24)))
    for i, g in enumerate(got):
        if i % 3 == 2:
            assert isinstance(g, IntegrityError)
        else:
            assert_same_snapshot(g, snaps[i % 3])
