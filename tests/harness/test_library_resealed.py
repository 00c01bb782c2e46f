"""A re-sealed library cannot graft another problem's KV (issue 41, finding 2): an entry pointed at another entry's
artifact (artifact_id, tokens and tokens_sha256 copied, every hash of the library re-sealed), or the same with
tokens_sha256 dropped from every row (the downgrade), is refused by graft and incontext: the entry's own text, from
the library's source, is tokenized and compared with the artifact's token ids. A library whose rows record
tokens_sha256 refuses a row without it. The tiny random-weight model, 3 entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import _write_library, build_library, open_library
from harness.run.conditions import build_condition
from harness.task.problems import load_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resealed")
    cfg = typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={tmp}/library",
                                f"library.store={tmp}/store", "library.dataset.limit=3", "dataset.limit=3",
                                "decoding.max_new_tokens=2", "tracking=off"]))
    be = load_model(cfg)
    path = build_library(cfg.library, be, REPO, progress=False)
    return cfg, be, path, (path / "index.jsonl").read_bytes(), (path / "manifest.json").read_bytes()


def _reseal(built, edit) -> None:
    cfg, be, path, index, manifest = built
    (path / "index.jsonl").write_bytes(index)
    (path / "manifest.json").write_bytes(manifest)
    rows = [json.loads(x) for x in index.decode().splitlines()]
    edit(rows)
    _write_library(path, json.loads(manifest), rows, be)  # every hash of the library recomputed: a re-seal


def _swap(rows, drop_all: bool = False) -> None:
    """Entry 0 takes entry 1's artifact (its id, token count and token hash)."""
    for k in ("artifact_id", "tokens", "tokens_sha256"):
        rows[0][k] = rows[1][k]
    if drop_all:
        for r in rows:
            r.pop("tokens_sha256")


@pytest.mark.parametrize("drop_all", [False, True], ids=["resealed", "downgraded"])
@pytest.mark.parametrize("condition", ["graft", "incontext"])
def test_an_entry_pointed_at_another_problems_artifact_is_refused(built, condition, drop_all):
    cfg, be, path, _, _ = built
    _reseal(built, lambda rows: _swap(rows, drop_all))
    lib = open_library(cfg.library, be, REPO)  # the re-seal itself checks
    problems = load_problems(str(REPO / cfg.dataset.path), limit=3)
    first = lib.entries[0]
    [target] = [p for p in problems if p.id == first.problem_id]
    cond = build_condition(condition, be, cfg.prompt, cfg.decoding, cfg.library, REPO)
    try:
        with pytest.raises(LibraryError, match="not the encoding of the entry's own text"):
            cond.context(target)
        other = [p for p in problems if p.id == lib.entries[2].problem_id][0]
        cond.context(other)  # an untouched entry still grafts
    finally:
        cond.close()


def test_a_row_without_tokens_sha256_in_a_library_that_records_it_is_refused(built):
    cfg, be, _, _, _ = built
    _reseal(built, lambda rows: rows[1].pop("tokens_sha256"))
    with pytest.raises(LibraryError, match="no tokens_sha256 where 2 other rows of this library record it"):
        open_library(cfg.library, be, REPO)


def test_an_entry_claiming_another_problems_fingerprint_is_refused(built):
    """Entries 0 and 1 claim each other's problem (fingerprint, text, answer: consistent, re-sealed): refused when
    the library is opened (issue 51: its rows are compared with its source), before any graft."""
    cfg, be, _, _, _ = built

    def claim(rows):
        for k in ("problem_fingerprint", "problem", "answer"):
            rows[0][k], rows[1][k] = rows[1][k], rows[0][k]
    _reseal(built, claim)
    with pytest.raises(LibraryError, match=r"index.jsonl, row 1 .*: problem .* but the library's source says"):
        open_library(cfg.library, be, REPO)


@pytest.mark.parametrize("field, edit", [
    ("problem", lambda r: r.update(problem=r["problem"] + " Also, what is 2 + 2?")),  # retrieval reads this text
    ("answer", lambda r: r.update(answer=str(int(r["answer"]) + 1))),                 # the copied-answer column reads it
    ("problem_id", lambda r: r.update(problem_id="kvg-999")),
], ids=["problem_text", "answer", "problem_id"])
def test_a_row_edited_and_resealed_is_refused_when_the_library_is_opened(built, field, edit):
    """Issue 51, item 9: re-sealed problem texts changed held-out retrieval silently, re-sealed answers the CoT
    table's "answered the grafted entry's answer" column; every index hash matched. The rows are compared with the
    library's source (the rows its identity hashes) when it is opened; the first difference is named."""
    cfg, be, _, _, _ = built
    _reseal(built, lambda rows: edit(rows[2]))
    with pytest.raises(LibraryError, match=rf"index.jsonl, row 3 \(entry \w+\): {field} .* but the library's "
                                           r"source says .*modified and re-sealed"):
        open_library(cfg.library, be, REPO)
