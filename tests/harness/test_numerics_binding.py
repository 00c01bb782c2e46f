"""An artifact binds the numerics it was computed under (issue 41, finding 0): the library build records the
numerics fingerprint of the depositing process beside each artifact (a store tag, so artifact ids do not move), a
graft under another numerics fingerprint is refused naming both (environment records equal), the build does not
reuse such an artifact, and `--redeposit` re-deposits it. Issue 51: absent evidence is not evidence: no record,
two records or an unreadable one is refused, and a rebuild re-verifies by recomputation (never re-stamps).
The tiny random-weight model, 2 entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import build_library, open_library, redeposit_library
from harness.run.conditions import build_condition
from harness.task.problems import load_problems
from kvstore import EnvironmentMismatchError, check_numerics, numerics_of_tags, open_store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(tmp_path):
    cfg = typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={tmp_path}/library",
                                f"library.store={tmp_path}/store", "library.dataset.limit=2", "dataset.limit=2",
                                "decoding.max_new_tokens=2", "tracking=off"]))
    be = load_model(cfg)
    build_library(cfg.library, be, REPO, progress=False)
    return cfg, be


def test_an_artifact_deposited_under_other_numerics_is_refused_naming_them(setup):
    cfg, be = setup
    store = open_store(cfg.library.store)
    entries = open_library(cfg.library, be, REPO).entries
    here = be.numerics()
    assert len(here) == 64
    for e in entries:  # recorded beside each artifact
        assert numerics_of_tags(store.info(e.artifact_id).tags) == [here]
    check_numerics(store.info(entries[0].artifact_id).tags, be)  # same numerics: admitted
    problems = load_problems(str(REPO / cfg.dataset.path), limit=2)
    cond = build_condition("graft", be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    cond.context(problems[0])  # grafts here
    cond.close()

    be.fm.__dict__["numerics"] = "f" * 64  # another machine: same environment record, other bits
    with pytest.raises(EnvironmentMismatchError, match=f"numerics_sha256: artifact {here[:16]}, this process ffff"):
        check_numerics(store.info(entries[0].artifact_id).tags, be, "entry")
    cond = build_condition("graft", be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    with pytest.raises(LibraryError, match="numerics_sha256: artifact .* --redeposit"):
        cond.context(problems[0])
    cond.close()
    with pytest.warns(RuntimeWarning, match="without matching numerics evidence"):
        check_numerics(store.info(entries[0].artifact_id).tags, be, allow_environment_mismatch=True)
    # --redeposit re-deposits what this process cannot graft exactly (here: the same bytes, whose record now names
    # what was measured here, in place of the other machine's: one fingerprint, never a list to pick from)
    out = redeposit_library(cfg.library, be, REPO, progress=False)
    assert out["redeposited"] == 2 and all("numerics_sha256" in d[0] for d in out["differences"].values())
    assert numerics_of_tags(store.info(entries[0].artifact_id).tags) == ["f" * 64]
    check_numerics(store.info(entries[0].artifact_id).tags, be)
    del be.fm.__dict__["numerics"]


def _strip_numerics(store) -> int:
    """Delete every numerics tag from the store's SQLite index, as an old kvgraft, a copy or a forger leaves it."""
    import sqlite3

    db = sqlite3.connect(store.index_path)
    n = db.execute("DELETE FROM tags WHERE tag LIKE 'numerics:%'").rowcount
    db.commit()
    db.close()
    return n


def test_an_artifact_without_the_tag_is_refused_and_the_rebuild_reverifies_it_by_recomputation(setup, capsys):
    """Issue 51, item 1: no numerics record is not "same numerics". Before, check_numerics and the build's
    _numerics_differ returned no difference, and the rebuild re-stamped this machine's tag on the reused artifact
    without measuring anything."""
    cfg, be = setup
    store = open_store(cfg.library.store)
    entries = open_library(cfg.library, be, REPO).entries
    aid = entries[0].artifact_id
    tags = [t for t in store.info(aid).tags if not t.startswith("numerics:")]
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        check_numerics(tags, be)  # the tags alone
    with pytest.raises(EnvironmentMismatchError, match="could not be read"):
        check_numerics(None, be)  # a failing lookup of the evidence refuses
    assert _strip_numerics(store) == 2
    problems = load_problems(str(REPO / cfg.dataset.path), limit=2)
    cond = build_condition("graft", be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    with pytest.raises(LibraryError, match="no numerics record"):
        cond.context(problems[0])  # the harness's graft condition
    cond.close()
    with pytest.raises(EnvironmentMismatchError, match="no numerics record"):
        be.graft(store.get(aid), None)  # kvstore's own graft, from the store
    # the rebuild says what it did about the missing evidence: re-verified by recomputation (same bytes here)
    capsys.readouterr()
    build_library(cfg.library, be, REPO, progress=False)
    out = capsys.readouterr().out
    assert "2 stored artifact(s)" in out and "no record: 2" in out and "re-verified by recomputation: 2 of 2" in out
    assert numerics_of_tags(store.info(aid).tags) == [be.numerics()]  # recorded: it was measured
    be.graft(store.get(aid), None)


def test_a_rebuild_never_stamps_a_tag_it_did_not_measure(setup, capsys, monkeypatch):
    """An artifact whose bytes this machine does not reproduce is not tagged: the recomputed artifact is used."""
    cfg, be = setup
    store = open_store(cfg.library.store)
    old = open_library(cfg.library, be, REPO).entries
    _strip_numerics(store)
    real = be.deposit

    def other_bits(ids, extra=None):  # this "machine" computes other KV for the same tokens
        snap = real(ids, extra)
        snap.layers[0].keys.add_(1.0)
        return snap

    monkeypatch.setattr(be, "deposit", other_bits)
    capsys.readouterr()
    import shutil

    shutil.rmtree(cfg.library.root)
    build_library(cfg.library, be, REPO, progress=False)
    out = capsys.readouterr().out
    assert "re-verified by recomputation: 0 of 2" in out and "2 did not" in out
    for e in old:
        assert numerics_of_tags(store.info(e.artifact_id).tags) == []  # never stamped
    new = open_library(cfg.library, be, REPO).entries
    assert {e.artifact_id for e in new}.isdisjoint({e.artifact_id for e in old})


def test_a_forged_tag_beside_the_real_one_is_refused(setup):
    """Issue 51, item 9: any listed fingerprint used to match; a record of two is refused, and the tagging API
    refuses to write one."""
    import sqlite3

    from kvstore import KVStoreError

    cfg, be = setup
    store = open_store(cfg.library.store)
    aid = open_library(cfg.library, be, REPO).entries[0].artifact_id
    with pytest.raises(KVStoreError, match="numerics record, not a free tag"):
        store.add_tags(aid, ["numerics:" + "e" * 64])
    db = sqlite3.connect(store.index_path)
    db.execute("INSERT INTO tags VALUES (?, ?)", (aid, "numerics:" + "e" * 64))
    db.commit()
    db.close()
    with pytest.raises(EnvironmentMismatchError, match="names 2 fingerprints"):
        check_numerics(store.info(aid).tags, be)
    with pytest.raises(EnvironmentMismatchError, match="names 2 fingerprints"):
        be.graft(store.get(aid), None)
