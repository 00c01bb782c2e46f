"""kvstore.store.prefetch.Prefetcher: background read + verify within a memory budget, refusing damaged bytes,
surfacing worker failures as KVStoreError, and never deadlocking when ids are asked for out of order."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kvstore import IntegrityError, KVStoreError, LocalStore, MemoryStore, NotFoundError
from kvstore.format.artifact import LayerKV
from kvstore.store.prefetch import Prefetcher

MISSING = "0" * 64


def _snapshots(hand_built, n: int) -> list:
    """n distinct snapshots of equal size (same shapes, different values)."""
    out = []
    for i in range(n):
        s = hand_built({"i": i})
        s.layers = [LayerKV(lyr.kind, lyr.window, lyr.cumulative_length, lyr.keys + i, lyr.values - i)
                    for lyr in s.layers]
        out.append(s)
    return out


@pytest.fixture
def local(tmp_path, hand_built):
    store = LocalStore(tmp_path / "store")
    ids = store.put_many(_snapshots(hand_built, 4))
    return store, ids


def _wait(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the prefetch worker"
        time.sleep(0.01)


def test_a_prefetched_snapshot_is_the_verified_one_the_store_returns(local, assert_same_snapshot):
    store, ids = local
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule(ids)
        _wait(lambda: len(pf._ready) == len(ids))  # as while a problem decodes
        assert pf.held_bytes == sum(store.info(a).size for a in ids) == pf.peak_bytes
        got = [pf.get(a) for a in ids]
        assert pf.hits == len(ids) and pf.misses == 0 and pf.held_bytes == 0
    for a, snap in zip(ids, got, strict=True):
        assert_same_snapshot(snap, store.get(a))


def test_a_tampered_byte_is_refused_through_the_prefetch_path(local):
    store, ids = local
    path = store.path(ids[1])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a byte of the last tensor
    path.write_bytes(bytes(data))  # in place, behind the store's back
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule(ids)
        _wait(lambda: ids[1] in pf._ready)
        with pytest.raises(IntegrityError, match=ids[1]):
            pf.get(ids[1])
        assert pf.get(ids[0]) is not None and pf.hits == 1


def test_bytes_changed_on_disk_after_the_prefetch_do_not_reach_the_snapshot(local, assert_same_snapshot):
    store, ids = local
    want = store.get(ids[0], private=True)  # (a mapped get's tensors would follow the file: FORMAT.md 4)
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule(ids[:1])
        _wait(lambda: ids[0] in pf._ready)
        path = store.path(ids[0])
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x01
        with open(path, "r+b") as f:  # rewritten in place after verification
            f.write(bytes(data))
        assert_same_snapshot(pf.get(ids[0]), want)  # the verified bytes, not the file's current ones
    with pytest.raises(IntegrityError):
        store.get(ids[0])


def test_the_memory_bound_holds_and_out_of_order_gets_do_not_deadlock(local):
    store, ids = local
    size = store.info(ids[0]).size
    with Prefetcher(store, max_bytes=size + size // 2) as pf:  # room for one artifact only
        pf.schedule(ids)
        _wait(lambda: ids[0] in pf._ready)
        time.sleep(0.2)  # the worker must now be waiting for budget, not reading the next one
        assert pf.held_bytes == size and list(pf._ready) == [ids[0]] and pf._busy is None
        last = pf.get(ids[3])  # queued behind the budget: read in this thread instead
        assert pf.misses == 1 and last.extra == {"i": 3}
        for i in (0, 1, 2):
            assert pf.get(ids[i]).extra == {"i": i}
        assert pf.peak_bytes <= pf.max_bytes and pf.held_bytes == 0


def test_an_artifact_larger_than_the_budget_is_read_by_the_caller(local):
    store, ids = local
    with Prefetcher(store, max_bytes=10) as pf:
        pf.schedule(ids[:1])
        _wait(lambda: not pf._queue)
        assert pf.get(ids[0]).extra == {"i": 0} and (pf.hits, pf.misses, pf.peak_bytes) == (0, 1, 0)


def test_a_miss_raises_not_found_scheduled_or_not(local):
    store, _ = local
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        with pytest.raises(NotFoundError):
            pf.get(MISSING)
        pf.schedule([MISSING])
        _wait(lambda: MISSING in pf._ready)
        with pytest.raises(NotFoundError):
            pf.get(MISSING)


class _FailingStore(MemoryStore):
    def get(self, aid):
        raise OSError(5, "Input/output error")


def test_an_error_in_the_worker_reaches_the_caller_as_a_kvstore_error(hand_built):
    store = _FailingStore()
    aid = store.put(hand_built())
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule([aid])
        _wait(lambda: aid in pf._ready)
        with pytest.raises(KVStoreError, match="Input/output error") as e:
            pf.get(aid)
        assert not isinstance(e.value, OSError) and isinstance(e.value.__cause__, OSError)
        assert pf.held_bytes == 0


def test_get_waits_for_an_artifact_being_read(hand_built):
    release = threading.Event()

    class Slow(MemoryStore):
        def get(self, aid):
            release.wait(30)
            return super().get(aid)

    store = Slow()
    aid = store.put(hand_built())
    with Prefetcher(store, max_bytes=1 << 30) as pf:
        pf.schedule([aid])
        _wait(lambda: pf._busy == aid)
        with pytest.raises(KVStoreError, match="did not finish"):
            pf.get(aid, timeout=0.05)
        release.set()
        assert torch.equal(pf.get(aid).layers[0].keys, hand_built().layers[0].keys) and pf.hits == 1


def test_bad_budgets_and_a_closed_prefetcher_are_refused(local):
    store, ids = local
    for bad in (-1, 1.5, True):
        with pytest.raises(KVStoreError, match="max_bytes"):
            Prefetcher(store, max_bytes=bad)
    pf = Prefetcher(store, max_bytes=1 << 20)
    pf.close()
    pf.close()
    with pytest.raises(KVStoreError, match="closed"):
        pf.get(ids[0])
