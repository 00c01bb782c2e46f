"""A library entry never takes another problem's artifact on an index row's word (issue 31, finding 1), on a local
store (SQLite index) and on an S3 store (rows in the bucket, SeaweedFS on 127.0.0.1): the build reuses a stored
artifact only when the artifact itself holds the entry's token ids (model, settings, environment compared too), says
which row lied, and `kvstore gc` repairs it; a graft (graft and incontext conditions) refuses an entry whose artifact
holds other tokens than the entry records. The fake backend: plumbing, in seconds."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import _write_library, build_library, open_library
from harness.run.conditions import build_condition
from harness.task.problems import load_problems
from kvstore import LocalStore, open_store
from kvstore.cli import main as kvstore_main

REPO = Path(__file__).resolve().parents[2]

@pytest.fixture(params=["local", "s3"])
def store_url(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    server = request.getfixturevalue("s3")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return f"s3://kvgraft/lib-{uuid.uuid4().hex[:12]}"


def _setup(tmp: Path, store: str, *extra: str):
    cfg = typed(compose_config(["model=fake", f"project_root={REPO}", f"runs_dir={tmp}/runs",
                                f"library.root={tmp}/library", f"library.store={store}", "library.dataset.limit=3",
                                "dataset.limit=3", "tracking=off", *extra]))
    return cfg, load_model(cfg)


def _forge_tokens_sha256(store, aid: str, value: str) -> None:
    """Set `aid`'s index row's tokens_sha256 to `value`: what anyone who may write the index (not the objects) can."""
    if isinstance(store, LocalStore):
        with sqlite3.connect(store.index_path) as db:
            db.execute("UPDATE artifacts SET tokens_sha256 = ? WHERE id = ?", (value, aid))
        return
    key = f"index/{aid}.json"
    row = {**json.loads(store.blobs.get(key)), "tokens_sha256": value}
    store.blobs.delete(key)
    store.blobs.create(key, json.dumps(row).encode())


def test_a_forged_index_row_does_not_redirect_a_library_entry(store_url, tmp_path, capsys):
    cfg, be = _setup(tmp_path, store_url)
    path = build_library(cfg.library, be, REPO, progress=False)
    first = {e.problem_id: e.artifact_id for e in open_library(cfg.library, be, REPO).entries}
    store = open_store(store_url)
    a, b = first["kvg-001"], first["kvg-002"]
    # the attack of finding 1: b's row claims kvg-001's tokens, a's row claims something else
    _forge_tokens_sha256(store, b, store.info(a).tokens_sha256)
    _forge_tokens_sha256(store, a, "0" * 64)
    for f in ("index.jsonl", "manifest.json"):
        (path / f).unlink()
    capsys.readouterr()
    build_library(cfg.library, be, REPO, progress=True)
    out, err = capsys.readouterr()
    again = {e.problem_id: e.artifact_id for e in open_library(cfg.library, be, REPO).entries}
    assert again == first  # every entry points at its own artifact (kvg-001's re-deposited: same bytes, same id)
    assert f"the index row of artifact {b} says it holds" in err and "kvstore gc --store" in err
    assert "1 of 3 entries already in the store (resumed)" in out  # kvg-003 only: the lying rows are not trusted
    for e in open_library(cfg.library, be, REPO).entries:
        assert e.tokens_sha256 == store.info(e.artifact_id).tokens_sha256 or e.artifact_id in (a, b)
    assert kvstore_main(["--store", store_url, "gc"]) == 1  # the lie reported and rewritten from the object
    assert f"{b}: index row tokens_sha256" in capsys.readouterr().out
    assert all(e.tokens_sha256 == store.info(e.artifact_id).tokens_sha256
               for e in open_library(cfg.library, be, REPO).entries)
    assert kvstore_main(["--store", store_url, "gc"]) == 0


@pytest.mark.parametrize("condition", ["graft", "incontext"])
def test_a_graft_refuses_an_entry_whose_artifact_holds_other_tokens(condition, tmp_path):
    """A library built before the build checked (or by anyone who re-signed its manifest) whose entry points at
    another entry's artifact: the condition refuses the row, naming the entry, instead of grafting another context."""
    cfg, be = _setup(tmp_path, str(tmp_path / "store"))
    path = build_library(cfg.library, be, REPO, progress=False)
    lib = open_library(cfg.library, be, REPO)
    rows = [e.to_row() for e in lib.entries]
    rows[0]["artifact_id"] = rows[1]["artifact_id"]
    for r in rows:  # as a library built before entries recorded it (issue 41: a row alone without it is refused)
        r.pop("tokens_sha256")
    _write_library(path, lib.manifest, rows, be)
    cond = build_condition(condition, be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    problems = load_problems(str(REPO / "problems/kvgraft_original.jsonl"), limit=2)
    with pytest.raises(LibraryError, match=rf"entry {rows[0]['entry_id']} \(problem kvg-001\): artifact "
                                           rf"{rows[1]['artifact_id'][:12]} holds \d+ tokens .* not the (encoding of the )?entry's"):
        cond.complete(problems[0], 0)
    assert cond.complete(problems[1], 0).retrieval.artifact_id == rows[1]["artifact_id"]  # its own entry grafts
