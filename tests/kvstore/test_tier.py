"""CachedStore: a bounded LRU host-memory tier in front of a store. Synthetic snapshots, no model needed."""

from __future__ import annotations

import pytest
import torch

from kvstore import (
    CachedStore,
    IntegrityError,
    KVStoreError,
    LocalStore,
    MemoryStore,
    NotFoundError,
    Snapshot,
    to_bytes,
)
from kvstore.format.artifact import LayerKV

_DET = {"threads": 2, "deterministic_algorithms": True, "attn_implementation": "sdpa", "dtype": "float32",
        "prefill_chunk": 512}


def _snapshot(seed: int, n: int = 8) -> Snapshot:
    g = torch.Generator().manual_seed(seed)
    layers = [LayerKV("full", None, n, torch.randn(1, 1, n, 4, generator=g), torch.randn(1, 1, n, 4, generator=g))]
    return Snapshot(token_ids=[2] + [seed % 200 + 4] * (n - 1), start_position=0, layers=layers,
                    model_fingerprint="c" * 64, tokenizer_fingerprint="d" * 64, dtype="float32",
                    determinism=_DET, environment={}, model_name="synthetic")


@pytest.fixture
def disk(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def test_second_get_is_a_hit_and_returns_identical_bytes(disk):
    aid = disk.put(_snapshot(1))
    tier = CachedStore(disk, max_bytes=1 << 20)
    first = tier.get_bytes(aid)
    second = tier.get_bytes(aid)
    assert first == second == disk.get_bytes(aid)
    assert (tier.hits, tier.misses) == (1, 1)
    assert to_bytes(tier.get(aid)) == disk.get_bytes(aid)
    assert tier.hits == 2


def test_snapshots_from_the_tier_do_not_share_tensors(disk):
    aid = disk.put(_snapshot(2))
    tier = CachedStore(disk, max_bytes=1 << 20)
    a, b = tier.get(aid), tier.get(aid)
    a.layers[0].keys.add_(1.0)  # a caller writing into its cache must not change what the tier serves
    assert not torch.equal(a.layers[0].keys, b.layers[0].keys)
    assert tier.get_bytes(aid) == disk.get_bytes(aid)


def test_bounded_tier_evicts_least_recently_used(disk):
    ids = [disk.put(_snapshot(i)) for i in range(3)]
    size = max(len(disk.get_bytes(a)) for a in ids)
    tier = CachedStore(disk, max_bytes=2 * size)
    tier.get_bytes(ids[0])
    tier.get_bytes(ids[1])
    tier.get_bytes(ids[0])  # ids[0] is now the most recently used
    tier.get_bytes(ids[2])  # evicts ids[1], the least recently used
    assert set(tier.cached_ids()) == {ids[0], ids[2]}
    assert tier.cached_bytes <= tier.max_bytes
    misses = tier.misses
    tier.get_bytes(ids[1])
    assert tier.misses == misses + 1


def test_artifact_larger_than_the_tier_is_served_but_not_kept(disk):
    aid = disk.put(_snapshot(3))
    tier = CachedStore(disk, max_bytes=10)
    assert tier.get_bytes(aid) == disk.get_bytes(aid)
    assert tier.cached_ids() == [] and tier.cached_bytes == 0


def test_corrupted_object_is_refused_on_first_read_and_never_kept(disk):
    aid = disk.put(_snapshot(4))
    path = disk.path(aid)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    tier = CachedStore(disk, max_bytes=1 << 20)
    with pytest.raises(IntegrityError):
        tier.get(aid)
    with pytest.raises(IntegrityError):
        tier.get_bytes(aid)
    assert tier.cached_ids() == [] and tier.hits == 0


def test_remove_drops_the_cached_copy(disk):
    aid = disk.put(_snapshot(5))
    tier = CachedStore(disk, max_bytes=1 << 20)
    tier.get_bytes(aid)
    tier.remove(aid)
    assert tier.cached_ids() == [] and aid not in tier
    with pytest.raises(NotFoundError):
        tier.get_bytes(aid)


def test_tier_has_the_store_interface():
    inner = MemoryStore()
    tier = CachedStore(inner, max_bytes=1 << 20)
    snap = _snapshot(6)
    aid = tier.put(snap, tags=["lib"])
    assert aid in tier and len(tier) == 1
    assert [i.id for i in tier.list("lib")] == [aid]
    assert tier.find_tokens(tier.info(aid).tokens_sha256) == [aid]
    assert tier.put_many([_snapshot(7), to_bytes(snap)])[1] == aid


def test_a_negative_bound_is_a_kvstore_error():
    with pytest.raises(KVStoreError, match="max_bytes=-1"):
        CachedStore(MemoryStore(), max_bytes=-1)
