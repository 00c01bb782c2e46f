"""Issue 51, item 1 (and the store half of item 9): absent evidence is not evidence. An artifact's numerics record
(its store's `numerics:` tags, attached to every snapshot a store reads, and to every capture by the process that
measured it) is checked by the one admission, so by every path that grafts: kvstore's graft, check_graft, the
restore worker, the fake / llama.cpp backends (which measure none) and vLLM's connector (its Facts). No record, a
record that cannot be read, or two fingerprints are refused in one line; a record read elsewhere (a bundle,
another store) is a claim, not recorded (issue 61); the tagging API cannot write one; `kvstore reverify` records only what it measured."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import (
    EnvironmentMismatchError,
    Facts,
    KVStoreError,
    LocalStore,
    MemoryStore,
    admission_differences,
    export_bundle,
    import_bundle,
)
from kvstore.backends.transformers import TransformersBackend
from kvstore.engine.verify import graft_logits
from kvstore.errors import IndexDatabaseError

IDS = [2] + [4 + (7 * i) % 200 for i in range(23)]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def be(tiny_gemma3):
    return TransformersBackend.of(tiny_gemma3)


@pytest.fixture
def stored(be, tmp_path):
    store = LocalStore(tmp_path / "store")
    return store, store.put(TransformersBackend.of(be.fm).deposit(IDS), tags=["t"])


def _strip(store: LocalStore) -> None:
    db = sqlite3.connect(store.index_path)
    db.execute("DELETE FROM tags WHERE tag LIKE 'numerics:%'")
    db.commit()
    db.close()


def test_a_deposit_records_what_it_measured_and_a_graft_from_the_store_admits_it(be, stored):
    store, aid = stored
    snap = store.get(aid)
    assert snap.numerics.fingerprints == (be.numerics(),) and snap.numerics.error is None
    be.graft(snap, IDS)


def test_an_artifact_without_a_record_is_refused_by_kvstores_graft_and_check_graft(be, stored):
    store, aid = stored
    _strip(store)
    with pytest.raises(EnvironmentMismatchError, match="no numerics record in LocalStore"):
        be.graft(store.get(aid), IDS)
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        graft_logits(be, IDS, IDS[:3], store=store, artifact_id=aid)  # check_graft's and the restore worker's half
    store.put(TransformersBackend.of(be.fm).deposit(IDS))  # deposited again here: measured, recorded
    be.graft(store.get(aid), IDS)


def test_a_failing_lookup_of_the_record_refuses(be, stored, monkeypatch):
    store, aid = stored

    def broken(aid):
        raise IndexDatabaseError("could not read the index: database is locked")

    monkeypatch.setattr(store.index, "get", broken)
    with pytest.raises(EnvironmentMismatchError, match="could not be read .*database is locked"):
        be.graft(store.get(aid), IDS)


def test_a_second_fingerprint_beside_the_real_one_is_refused(be, stored):
    store, aid = stored
    with pytest.raises(KVStoreError, match="numerics record, not a free tag"):
        store.add_tags(aid, ["numerics:" + be.numerics()[::-1]])
    db = sqlite3.connect(store.index_path)  # forged past the API: a second fingerprint, this machine's one kept
    db.execute("INSERT INTO tags VALUES (?, ?)", (aid, "numerics:" + "0" * 64))
    db.commit()
    db.close()
    with pytest.raises(EnvironmentMismatchError, match="names 2 fingerprints"):
        be.graft(store.get(aid), IDS)


def test_a_snapshot_parsed_from_bytes_carries_no_evidence(be, stored):
    from kvstore import from_bytes

    store, aid = stored
    with pytest.raises(EnvironmentMismatchError, match="not read from a store"):
        be.graft(from_bytes(store.get_bytes(aid)), IDS)


def test_a_record_read_elsewhere_arrives_as_a_claim_and_is_re_verified_before_a_graft(be, stored, tmp_path):
    store, aid = stored
    export_bundle(store, [aid], tmp_path / "b.kvb")
    other = LocalStore(tmp_path / "other")
    info = import_bundle(tmp_path / "b.kvb", other)
    assert info.claims == (aid,) and other.get(aid).numerics.fingerprints == ()  # another machine's claim (issue 61)
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        be.graft(other.get(aid), IDS)
    mem = MemoryStore()
    mem.put(store.get(aid))  # a snapshot read from one store, put into another: its record is a claim there too
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        be.graft(mem.get(aid), IDS)
    mem.put(TransformersBackend.of(be.fm).deposit(IDS))  # reproduced here: the same bytes, measured, recorded
    be.graft(mem.get(aid), IDS)


def test_an_engine_that_measures_none_refuses_a_record_it_cannot_confirm(be, stored):
    from kvstore import NumericsRecord  # (imported here: the commit before issue 51 has none, and fails per test)

    store, aid = stored
    snap = store.get(aid)
    facts = Facts.of(be)
    assert not admission_differences(snap, facts)
    blind = Facts(**{**facts.__dict__, "numerics": None})  # vLLM's connector and llama.cpp measure none
    [d] = admission_differences(snap, blind)
    assert d.fact == "numerics" and "this engine measures none" in d.message
    snap.numerics = NumericsRecord((), "a store")
    assert not admission_differences(snap, blind)  # its evidence is the environment record in the bytes


def test_the_restore_worker_refuses_an_artifact_without_a_record(be, stored):
    from kvstore.engine.restore_worker import ModelSpec, RestoreWorker
    from kvstore.errors import RemoteGraftError

    store, aid = stored
    _strip(store)
    spec = ModelSpec.backend("transformers", source="tiny-gemma3", determinism=be.fm.determinism.to_dict())
    with RestoreWorker(spec, store.root) as worker, pytest.raises(RemoteGraftError, match="no numerics record"):
        worker.restore(aid, IDS, IDS[:3])


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600)


def test_reverify_records_only_what_it_reproduced_and_gc_says_it_indexed_without_tags(be, stored):
    store, aid = stored
    _strip(store)
    r = _cli("--store", str(store.root), "--model", "tiny-gemma3", "reverify", aid)
    assert r.returncode == 0 and f"SAME    {aid}: reproduced byte for byte here" in r.stdout, r.stderr
    be.graft(store.get(aid), IDS)  # measured, recorded: admitted
    store.index_path.unlink()  # the index lost: gc rebuilds it from the objects, and says what it could not
    r = _cli("--store", str(store.root), "gc")
    assert "indexed WITHOUT TAGS" in r.stdout and "objects indexed     1" in r.stdout
    assert LocalStore(store.root).info(aid).tags == ()
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        be.graft(LocalStore(store.root).get(aid), IDS)
