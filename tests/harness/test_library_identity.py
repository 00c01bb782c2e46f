"""A library is identified by everything that determines its content (source rows and file hash, selection,
entry template, model): one built from other content is never reused; opening one re-checks its manifest's own
hash, its identity and every index line. Tiny random-weight model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import build_library, open_library
from harness.record.hashing import sha256_json
from harness.task.problems import Problem

REPO = Path(__file__).resolve().parents[2]


def _cfg(root: Path, store: Path, *extra: str):
    return typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={root}",
                                 f"library.store={store}", "library.dataset.limit=3", *extra]))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(config, model, library folder) of a 3-entry library; tests that change it work on a copy."""
    tmp = tmp_path_factory.mktemp("lib")
    cfg = _cfg(tmp / "library", tmp / "store")
    fm = load_model(typed(cfg))
    return cfg, fm, build_library(cfg.library, fm, REPO, progress=False)


@pytest.fixture
def copy(built, tmp_path):
    """A copy of the built library under tmp_path/library (same store): (config, model, folder)."""
    cfg, fm, path = built
    shutil.copytree(path, tmp_path / "library" / path.name)
    return _cfg(tmp_path / "library", Path(cfg.library.store)), fm, tmp_path / "library" / path.name


def test_a_library_built_with_another_limit_is_never_reused(built, capsys):
    cfg, fm, path = built
    assert len(open_library(cfg.library, fm, REPO).entries) == 3
    default = _cfg(path.parent, Path(cfg.library.store), "library.dataset.limit=2")
    with pytest.raises(LibraryError, match=r"no library kvgraft_original v2 built from this content"):
        open_library(default.library, fm, REPO)
    lib = open_library(default.library, fm, REPO, build_if_missing=True)
    assert len(lib.entries) == 2 and lib.path != path and lib.path.parent == path.parent
    assert len(open_library(cfg.library, fm, REPO).entries) == 3  # the first is untouched
    ids = [json.loads((p / "manifest.json").read_text())["identity"] for p in (path, lib.path)]
    assert ids[0]["source_limit"] == 3 and ids[1]["source_limit"] == 2
    assert ids[0]["candidates_sha256"] != ids[1]["candidates_sha256"]


def test_another_source_file_or_template_is_another_library(built, tmp_path):
    cfg, fm, path = built
    rows = (REPO / "problems" / "kvgraft_original.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    first["problem"] += " (reworded)"
    other_file = tmp_path / "p.jsonl"
    other_file.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    store = Path(cfg.library.store)
    for extra in ([f"library.dataset.path={other_file}"], ["library.entry_template='Q: {problem} A: {answer}'"]):
        other = _cfg(path.parent, store, *extra)
        with pytest.raises(LibraryError, match="no library"):
            open_library(other.library, fm, REPO)
    assert json.loads((path / "manifest.json").read_text())["identity"]["source_file_sha256"]


def test_an_edited_library_manifest_is_refused_on_open(copy):
    cfg, fm, path = copy
    m = json.loads((path / "manifest.json").read_text())
    m["tokens_total"] += 1
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LibraryError, match=r"manifest.json: manifest_sha256 does not match the manifest's content"):
        open_library(cfg.library, fm, REPO)


def test_a_folder_holding_another_librarys_manifest_is_refused_naming_what_differs(copy):
    cfg, fm, path = copy
    m = json.loads((path / "manifest.json").read_text())
    m["identity"]["source_limit"] = 6
    m["identity_sha256"] = sha256_json(m["identity"])
    m["manifest_sha256"] = sha256_json({k: v for k, v in m.items() if k != "manifest_sha256"})
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LibraryError, match=r"identity_sha256 is not that of the configured library \(differs in: "
                                           r"source_limit\)"):
        open_library(cfg.library, fm, REPO)


@pytest.mark.parametrize("bad, says", [
    (b'{"entry_id": \n', "not valid UTF-8 JSON"),
    (b"[1, 2]\n", "expected a JSON object (an entry), found list"),
    (b'{"entry_id": "\xff\xfe"}\n', "not valid UTF-8 JSON"),
], ids=["invalid_json", "not_an_object", "bad_utf8"])
def test_a_bad_index_line_is_one_library_error_naming_file_and_line(copy, bad, says):
    cfg, fm, path = copy
    lines = (path / "index.jsonl").read_bytes().splitlines(keepends=True)
    lines[1] = bad
    (path / "index.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(LibraryError) as exc:
        open_library(cfg.library, fm, REPO)
    msg = str(exc.value)
    assert msg.startswith(f"{path / 'index.jsonl'}, line 2: {says}") and "\n" not in msg, msg


def test_an_exact_match_with_another_answer_is_refused(built):
    cfg, fm, _ = built
    lib = open_library(cfg.library, fm, REPO)
    e = lib.entries[0]
    same_text = Problem("other-set-7", e.problem, str((int(e.answer) + 1) % 1000))
    with pytest.raises(LibraryError, match=rf"problem other-set-7: library .* holds the same problem text \(entry "
                                           rf"{e.entry_id}, problem {e.problem_id}\) with answer {e.answer}"):
        lib.retrieve(same_text)
    assert lib.retrieve(Problem("again", e.problem, e.answer)).kind == "exact"
