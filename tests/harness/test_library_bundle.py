"""A solution library as one bundle (harness/library/bundle.py): its files travel as the bundle's opaque
attachments; export and import check them with the library's own rules, so a modified library, or a bundle whose
library names an artifact it does not carry, is refused before anything is written. Tiny random-weight model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.errors import LibraryError
from harness.library.build import LIBRARY_FILES, Library, build_library
from harness.library.bundle import export_library, import_library, main
from kvstore import LocalStore
from kvstore.bundle.bundle import export_bundle

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(store, library folder) of a 2-entry library."""
    tmp = tmp_path_factory.mktemp("lib")
    cfg = typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={tmp / 'library'}",
                                f"library.store={tmp / 'store'}", "library.dataset.limit=2"]))
    folder = build_library(cfg.library, load_model(typed(cfg)), REPO, progress=False)
    return LocalStore(tmp / "store"), folder


def test_a_library_round_trips_into_another_store_and_opens_there(built, tmp_path):
    store, folder = built
    info = export_library(store, folder, tmp_path / "lib.kvb")
    entries = Library(folder, store).entries
    assert set(info.artifacts) == {e.artifact_id for e in entries} and set(info.attachments) == set(LIBRARY_FILES)
    other = LocalStore(tmp_path / "other")
    got = import_library(tmp_path / "lib.kvb", other, tmp_path / "copy")
    assert set(got.added) == set(info.artifacts)
    for name in LIBRARY_FILES:
        assert (tmp_path / "copy" / name).read_bytes() == (folder / name).read_bytes()
    reopened = Library(tmp_path / "copy", other)
    assert [e.entry_id for e in reopened.entries] == [e.entry_id for e in entries]
    assert all(other.get_bytes(e.artifact_id) == store.get_bytes(e.artifact_id) for e in entries)


def test_a_modified_library_is_not_exported(built, tmp_path):
    store, folder = built
    edited = tmp_path / "edited"
    edited.mkdir()
    for name in LIBRARY_FILES:
        (edited / name).write_bytes((folder / name).read_bytes())
    m = json.loads((edited / "manifest.json").read_text())
    m["name"] = "renamed"
    (edited / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LibraryError, match="manifest_sha256 does not match"):
        export_library(store, edited, tmp_path / "x.kvb")
    assert not (tmp_path / "x.kvb").exists()


def test_a_bundle_whose_library_names_an_artifact_it_lacks_is_refused_before_anything_is_written(built, tmp_path):
    store, folder = built
    entries = Library(folder, store).entries
    files = {name: (folder / name).read_bytes() for name in LIBRARY_FILES}
    export_bundle(store, [entries[0].artifact_id], tmp_path / "short.kvb", attachments=files)  # one artifact short
    other = LocalStore(tmp_path / "other")
    with pytest.raises(LibraryError, match="does not carry"):
        import_library(tmp_path / "short.kvb", other, tmp_path / "copy")
    assert len(other) == 0 and not (tmp_path / "copy").exists()


def test_the_command_line_exports_and_imports_a_library(built, tmp_path, capsys):
    store, folder = built
    main(["export", "--library", str(folder), "--store", str(store.root), "-o", str(tmp_path / "l.kvb")])
    main(["import", str(tmp_path / "l.kvb"), "--store", str(tmp_path / "other"), "--library-dir", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert "exported library" in out and "2 new" in out and (tmp_path / "c" / "manifest.json").exists()
