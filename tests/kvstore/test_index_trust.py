"""An index row is a claim, checked against its object: on a local store (SQLite index) and on an S3 store (rows in
the bucket, SeaweedFS on 127.0.0.1), a row that names another artifact's token hash is reported and rewritten by
`gc`; a damaged S3 row hides nothing but its own object (ls, verify and token lookups go on; verify names the
object without a row; `rm` and `gc` remove or rewrite it); `kvstore gc` on an S3 store prints its report (issue 31,
findings 1 and 8)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import uuid

import pytest

from kvstore import LocalStore, Prefetcher, tokens_sha256
from kvstore.cli import main
from kvstore.format.ids import ArtifactId


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch):
    """(the store, its --store argument): a LocalStore, or a fresh prefix of the local S3 server."""
    if request.param == "local":
        return LocalStore(tmp_path / "store"), str(tmp_path / "store")
    server = request.getfixturevalue("s3")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    from kvstore.store.s3 import S3Store

    url = f"s3://kvgraft/t-{uuid.uuid4().hex[:12]}"
    return S3Store(url, endpoint_url=server.endpoint), url


def _forge(store, aid: str, **fields) -> None:
    """Rewrite `aid`'s index row with `fields` changed, as a writer with access to the index (not the objects) can."""
    if isinstance(store, LocalStore):
        with sqlite3.connect(store.index_path) as db:
            for k, v in fields.items():
                db.execute(f"UPDATE artifacts SET {k} = ? WHERE id = ?", (v, aid))
        return
    key = f"index/{aid}.json"
    row = {**json.loads(store.blobs.get(key)), **fields}
    store.blobs.delete(key)
    store.blobs.create(key, json.dumps(row).encode())


def _two(store, hand_built):
    a = store.put(hand_built({"n": "a"}), tags=["lib:a"])
    b_snap = dataclasses.replace(hand_built({"n": "b"}), token_ids=[2, 5, 7, 11, 17])
    b = store.put(b_snap, tags=["lib:b"])
    return a, b, tokens_sha256(b_snap.token_ids)


def test_gc_rewrites_a_row_that_names_another_artifacts_tokens(store, hand_built, capsys):
    store, where = store
    a, b, b_tokens = _two(store, hand_built)
    _forge(store, a, tokens_sha256=b_tokens, model_name="forged")
    assert store.find_tokens(b_tokens) == sorted([a, b])  # the lie, as a lookup sees it
    assert main(["--store", where, "gc"]) == 1  # reported (exit 1), and repaired
    out = capsys.readouterr().out
    assert "index rows repaired 1" in out and f"{a}: index row tokens_sha256 {b_tokens[:16]}.. (object: " in out
    assert "model_name forged (object: golden)" in out and "KeyError" not in out
    assert store.find_tokens(b_tokens) == [b]
    info = store.info(a)
    assert info.tokens_sha256 == tokens_sha256([2, 5, 7, 11, 13]) and info.tags == ("lib:a",)  # tags kept
    assert main(["--store", where, "gc"]) == 0  # nothing left to repair
    assert "index rows repaired 0" in capsys.readouterr().out


def test_gc_on_any_store_prints_its_report(store, capsys):
    store, where = store
    assert main(["--store", where, "gc"]) == 0
    out = capsys.readouterr().out
    assert "index rows dropped  0" in out and "damaged             0" in out
    assert ("temp files removed" in out) == isinstance(store, LocalStore)  # S3 has no temp files: no KeyError


def test_a_damaged_s3_row_hides_only_its_object_until_gc_rewrites_it(s3, monkeypatch, hand_built, capsys):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    from kvstore.store.s3 import S3Store

    url = f"s3://kvgraft/t-{uuid.uuid4().hex[:12]}"
    store = S3Store(url, endpoint_url=s3.endpoint)
    a, b, b_tokens = _two(store, hand_built)
    store.blobs.delete(f"index/{a}.json")
    store.blobs.create(f"index/{a}.json", b"\x00not json")
    assert [i.id for i in store.list()] == [b] and store.find_tokens(b_tokens) == [b]  # ls and lookups go on
    assert store.unindexed() == [a]
    with Prefetcher(store, 1 << 20) as pf:  # a missing row never blocks a read (the prefetcher sizes the object)
        pf.schedule([a])
        assert pf.get(a).token_ids == [2, 5, 7, 11, 13]
    assert main(["--store", url, "verify"]) == 1
    out, err = capsys.readouterr()
    assert f"OK      {b}" in out and f"NO ROW  {a}: bytes OK" in out and "run `kvstore gc` to index them" in err
    assert main(["--store", url, "gc"]) == 1
    assert f"{a}: index row damaged" in capsys.readouterr().out
    assert [(i.id, i.tags) for i in store.list()] == [(a, ("lib:a",)), (b, ("lib:b",))]
    assert main(["--store", url, "verify"]) == 0
    # a damaged row with its object is removed by `kvstore rm PREFIX` (found among the objects without a row)
    store.blobs.delete(f"index/{a}.json")
    store.blobs.create(f"index/{a}.json", b"{}")
    assert main(["--store", url, "rm", a[:12]]) == 0 and a not in store and store.blobs.list(f"index/{a}") == []
    assert main(["--store", url, "gc"]) == 0


def test_verify_names_an_object_without_a_row_on_a_local_store(tmp_path, hand_built, capsys):
    store = LocalStore(tmp_path / "store")
    a = store.put(hand_built())
    store.index.remove(a)
    assert main(["--store", str(tmp_path / "store"), "verify"]) == 1
    out, err = capsys.readouterr()
    assert f"NO ROW  {ArtifactId(a)}" in out and "1 object(s) without a readable index row" in err
    assert main(["--store", str(tmp_path / "store"), "gc"]) == 0 and store.info(a).id == a


def test_ls_shows_control_characters_and_markup_in_rows_escaped(tmp_path, hand_built, capsys):
    store = LocalStore(tmp_path / "store")
    snap = dataclasses.replace(hand_built(), model_name="\x1b[2Jm [red]x")
    store.put(snap, tags=["t\x1b]0;pwned\x07"])
    assert main(["--store", str(tmp_path / "store"), "ls"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[2J" not in out and "\x07" not in out and "\\x1b[2Jm [red]x" in out and "t\\x1b]0;pwned\\x07" in out
