"""LocalStore.put_many: the same store as a loop of put, with one index transaction. Synthetic snapshots."""

from __future__ import annotations

import torch

from kvstore import LocalStore, MemoryStore, Snapshot, to_bytes, tokens_sha256
from kvstore.format.artifact import LayerKV

_DET = {"threads": 2, "deterministic_algorithms": True, "attn_implementation": "sdpa", "dtype": "float32",
        "prefill_chunk": 512}


def _snapshot(seed: int, n: int = 6) -> Snapshot:
    g = torch.Generator().manual_seed(seed)
    layers = [LayerKV("full", None, n, torch.randn(1, 1, n, 4, generator=g), torch.randn(1, 1, n, 4, generator=g))]
    return Snapshot(token_ids=[2, seed + 4] + [5] * (n - 2), start_position=0, layers=layers,
                    model_fingerprint="c" * 64, tokenizer_fingerprint="d" * 64, dtype="float32",
                    determinism=_DET, environment={}, model_name="synthetic")


def test_put_many_equals_a_loop_of_put(tmp_path):
    snaps = [_snapshot(i) for i in range(5)]
    batched, looped = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    ids = batched.put_many(snaps[:3] + [to_bytes(s) for s in snaps[3:]], tags=["lib"])
    assert ids == [looped.put(s, tags=["lib"]) for s in snaps]
    assert [(i.id, i.size, i.token_count, i.tokens_sha256, i.tags) for i in batched.list()] == \
        [(i.id, i.size, i.token_count, i.tokens_sha256, i.tags) for i in looped.list()]
    for aid, s in zip(ids, snaps, strict=True):
        assert batched.get_bytes(aid) == to_bytes(s)
        assert batched.find_tokens(tokens_sha256(s.token_ids)) == [aid]
    assert len(LocalStore(tmp_path / "a")) == 5  # the index persists


def test_put_many_of_existing_artifacts_only_adds_tags(tmp_path):
    store = LocalStore(tmp_path / "s")
    aid = store.put(_snapshot(1), tags=["a"])
    assert store.put_many([_snapshot(1), _snapshot(1)], tags=["b"]) == [aid, aid]
    assert len(store) == 1 and store.info(aid).tags == ("a", "b")


def test_put_many_leaves_no_temp_files_and_gc_finds_nothing_to_fix(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put_many([_snapshot(i) for i in range(4)])
    assert not [p for p in (tmp_path / "s" / "objects").rglob(".*")]
    assert store.gc() == {"temp_removed": 0, "temp_kept": 0, "rows_dropped": 0, "rows_repaired": [], "objects_indexed": 0, "damaged": []}


def test_put_many_on_the_memory_twin():
    store = MemoryStore()
    ids = store.put_many([_snapshot(i) for i in range(3)], tags=["x"])
    assert [i.id for i in store.list("x")] == sorted(ids)
