"""Issue 51, item 8: verify the bytes you use. A store's get copies the object into memory of its own, hashes the copy
and lays the tensors over that same copy, so an object rewritten in place after the hash check (same size) never
reaches a tensor, and one truncated after the read (a SIGBUS on a mapping before) changes nothing of a snapshot
already returned. The same read serves every path that grafts (kvstore's graft, the harness, the restore worker,
vLLM's connector on both sides), so nothing unverified can reach an engine's cache."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kvstore.store.verified_read as verified_read
from kvstore import IntegrityError, LocalStore
from kvstore.format.ids import ArtifactId

REPO = Path(__file__).resolve().parents[2]


def _rewrite_tail(path: Path, n: int = 64) -> None:
    """Rewrite the object's last `n` bytes (tensor data) in place, same size, as an in-place writer would."""
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.seek(-n, 2)
        old = f.read(n)
        f.seek(-n, 2)
        f.write(bytes(b ^ 0x5A for b in old))


@pytest.fixture(params=["overlapped", "serial"])
def stored(request, tmp_path, hand_built, monkeypatch):
    monkeypatch.setattr(verified_read, "OVERLAP_MIN", 0 if request.param == "overlapped" else 1 << 40)
    store = LocalStore(tmp_path / "store")
    snap = hand_built()
    return store, store.put(snap), snap


def test_an_object_rewritten_in_place_after_the_hash_check_is_not_what_the_tensors_hold(stored, monkeypatch,
                                                                                        assert_same_snapshot):
    store, aid, snap = stored
    path = store.path(aid)

    class RewriteAfterHashing(ArtifactId):
        @classmethod
        def of(cls, data):  # the check passes on the bytes as they were; the file changes right after it
            got = ArtifactId.of(data)
            _rewrite_tail(path)
            return got

    monkeypatch.setattr(verified_read, "ArtifactId", RewriteAfterHashing)
    got = store.get(aid)
    assert_same_snapshot(got, snap)  # the verified bytes, not the rewritten file
    monkeypatch.undo()
    with pytest.raises(IntegrityError, match="bytes hash to"):
        store.get(aid)  # the next read sees the rewrite and refuses it


def test_a_snapshot_returned_before_an_in_place_rewrite_keeps_its_bytes(stored, assert_same_snapshot):
    store, aid, snap = stored
    got = store.get(aid)
    _rewrite_tail(store.path(aid))
    assert_same_snapshot(got, snap)


_TRUNCATE = textwrap.dedent("""
    import os, sys, torch
    from kvstore import LocalStore, Snapshot
    from kvstore.format.artifact import LayerKV
    k = torch.arange(2 * 600 * 4, dtype=torch.float32).reshape(1, 2, 600, 4)
    det = {"attn_implementation": "sdpa", "deterministic_algorithms": True, "dtype": "float32", "prefill_chunk": 512,
           "threads": 2}
    snap = Snapshot(list(range(2, 602)), 0, [LayerKV("full", None, 600, k, -k)], "a" * 64, "b" * 64, "float32",
                    det, {"device_kind": "cpu"}, "golden")
    store = LocalStore(sys.argv[1])
    aid = store.put(snap)
    got = store.get(aid)
    os.chmod(store.path(aid), 0o644)
    os.truncate(store.path(aid), 0)          # truncated after the read (a mapping's pages are now gone)
    total = float(sum(l.keys.sum() + l.values.sum() for l in got.layers))
    print("read", total == float(k.sum() - k.sum()), flush=True)
""")


def test_an_object_truncated_after_the_read_does_not_kill_the_reader(tmp_path):
    r = subprocess.run([sys.executable, "-c", _TRUNCATE, str(tmp_path / "store")], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0 and "read True" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_an_object_truncated_before_the_read_is_refused_in_one_line(stored):
    store, aid, _ = stored
    path = store.path(aid)
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(IntegrityError, match="bytes hash to"):
        store.get(aid)
    assert torch.get_num_threads() >= 1
