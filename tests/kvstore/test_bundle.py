"""Bundles (kvstore.bundle.bundle, FORMAT.md section 7): export -> import round trips byte for byte (artifacts, tags and
opaque attachments), grafts exactly in another process, and every hostile bundle is refused with the target store
left exactly as it was. (A solution library as a bundle: tests/harness/test_library_bundle.py.)"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kvstore import LocalStore, MemoryStore, to_bytes
from kvstore.bundle.bundle import MANIFEST_NAME, BundleInfo, export_bundle, import_bundle
from kvstore.cli import main
from kvstore.errors import BundleError
from kvstore.format.ids import ArtifactId, id_to_relpath

ROOT = Path(__file__).resolve().parents[2]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Every file under root (the index database included) -> SHA-256 of its bytes."""
    return {str(p.relative_to(root)): _sha(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


# two opaque files: the engine carries them unchanged, whatever they hold
FILES = {"notes.txt": "attachments are opaque: é\n".encode(), "z.bin": bytes(range(256))}


@pytest.fixture
def source(tmp_path, hand_built):
    """A store with three hand-built artifacts (two tagged), and two files to attach."""
    store = LocalStore(tmp_path / "src")
    ids = [store.put(hand_built({"n": n}), tags=["demo"] if n < 2 else []) for n in range(3)]
    return store, ids, dict(FILES)


@pytest.fixture
def target(tmp_path, hand_built):
    """A store that already holds one unrelated artifact, and a snapshot of every byte under it."""
    store = LocalStore(tmp_path / "dst")
    store.put(hand_built({"other": True}), tags=["mine"])
    return store


def test_round_trip_is_byte_identical_for_artifacts_tags_and_attachments(source, target, tmp_path):
    store, ids, files = source
    out = export_bundle(store, ids, tmp_path / "b.kvb", attachments=files)
    assert isinstance(out, BundleInfo) and out.artifacts == tuple(sorted(ids))
    assert out.sha256 == _sha((tmp_path / "b.kvb").read_bytes())
    got = import_bundle(tmp_path / "b.kvb", target, attachments_dir=tmp_path / "files")
    assert got.artifacts == out.artifacts and set(got.added) == set(ids)
    assert got.sha256 == out.sha256 and got.manifest_sha256 == out.manifest_sha256
    for aid in ids:
        assert ArtifactId.of(target.path(aid).read_bytes()) == ArtifactId.of(store.path(aid).read_bytes()) == aid
        assert target.info(aid).tags == store.info(aid).tags
    assert {p.name: p.read_bytes() for p in (tmp_path / "files").iterdir()} == files
    assert got.attachments == out.attachments == {n: _sha(b) for n, b in files.items()}
    assert got.attachments_dir == tmp_path / "files" and len(target) == 4


def test_the_same_artifacts_give_the_same_bundle_bytes(source, tmp_path):
    store, ids, _ = source
    a = export_bundle(store, ids, tmp_path / "a.kvb")
    b = export_bundle(store, list(reversed(ids)), tmp_path / "b.kvb")
    assert (tmp_path / "a.kvb").read_bytes() == (tmp_path / "b.kvb").read_bytes() and a.sha256 == b.sha256
    with tarfile.open(tmp_path / "a.kvb") as tar:
        names = tar.getnames()
    assert names == [MANIFEST_NAME, *sorted(id_to_relpath(i) for i in ids)]


def test_importing_ids_the_store_already_has_adds_only_the_rest(source, target, tmp_path):
    store, ids, _ = source
    target.put_bytes(store.get_bytes(ids[0]))
    before = target.path(ids[0]).stat().st_mtime_ns
    export_bundle(store, ids, tmp_path / "b.kvb")
    got = import_bundle(tmp_path / "b.kvb", target)
    assert set(got.added) == set(ids[1:]) and target.path(ids[0]).stat().st_mtime_ns == before
    tree = _tree(target.root)
    assert import_bundle(tmp_path / "b.kvb", target).added == ()  # a second import changes nothing
    assert _tree(target.root) == tree


def test_an_import_killed_after_writing_objects_is_completed_by_running_it_again(source, target, tmp_path):
    store, ids, _ = source
    export_bundle(store, ids, tmp_path / "b.kvb")
    # what a kill -9 between the object writes and the index transaction leaves: objects without rows
    for aid in ids[:2]:
        target.path(aid).parent.mkdir(parents=True, exist_ok=True)
        target.path(aid).write_bytes(store.get_bytes(aid))
    import_bundle(tmp_path / "b.kvb", target)
    assert {i.id for i in target.list()} >= set(ids) and target.info(ids[0]).tags == ("demo",)


def test_import_works_into_the_in_memory_store(source, tmp_path):
    store, ids, _ = source
    export_bundle(store, ids, tmp_path / "b.kvb")
    mem = MemoryStore()
    import_bundle(tmp_path / "b.kvb", mem)
    assert [mem.get_bytes(a) for a in ids] == [store.get_bytes(a) for a in ids]


def test_export_refuses_an_existing_output_an_empty_set_and_an_unsafe_attachment_name(source, tmp_path):
    store, ids, files = source
    (tmp_path / "exists.kvb").write_bytes(b"x")
    with pytest.raises(BundleError, match="already exists"):
        export_bundle(store, ids, tmp_path / "exists.kvb")
    with pytest.raises(BundleError, match="nothing to export"):
        export_bundle(store, [], tmp_path / "none.kvb")
    for name in ("../evil", ".hidden", "a/b", "", "x" * 129):
        with pytest.raises(BundleError, match="not one safe file name"):
            export_bundle(store, ids, tmp_path / "bad.kvb", attachments={name: b"x"})
    assert not (tmp_path / "none.kvb").exists() and not (tmp_path / "bad.kvb").exists()


def test_the_callers_check_refuses_a_bundle_before_anything_is_written(source, target, tmp_path):
    store, ids, files = source
    export_bundle(store, ids, tmp_path / "b.kvb", attachments=files)
    before, seen = _tree(target.root), []

    def check(attached, carried):
        seen.append((dict(attached), carried))  # read during the call: the bundle is open only then
        raise ValueError("not what I expected")

    with pytest.raises(ValueError, match="not what I expected"):
        import_bundle(tmp_path / "b.kvb", target, attachments_dir=tmp_path / "files", check=check)
    assert seen == [(files, frozenset(ids))]
    assert _tree(target.root) == before and not (tmp_path / "files").exists()


def _as_format_1(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """A bundle as kvgraft-bundle/1 wrote it: the attachments under the manifest key and folder "library"."""
    def edit(m):
        m["format"], m["library"] = "kvgraft-bundle/1", m.pop("attachments")

    renamed = [(n.replace("attachments/", "library/", 1), b) for n, b in members]
    return _manifest(renamed, edit)


def test_a_format_1_bundle_still_imports_with_its_files(source, target, tmp_path):
    store, ids, files = source
    good = export_bundle(store, ids, tmp_path / "b.kvb", attachments=files).path
    old = _write(tmp_path / "old.kvb", _as_format_1(_members(good)))
    got = import_bundle(old, target, attachments_dir=tmp_path / "files")
    assert set(got.added) == set(ids) and got.attachments == {n: _sha(b) for n, b in files.items()}
    assert {p.name: p.read_bytes() for p in (tmp_path / "files").iterdir()} == files


# --------------------------------------------------------------------------------------------- hostile bundles


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:  # our own, trusted bundle
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _write(path: Path, members: list, fmt: int = tarfile.USTAR_FORMAT) -> Path:
    """members: (name, bytes) regular files, or TarInfo objects for anything else."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                ti = tarfile.TarInfo(m[0])
                ti.size = len(m[1])
                tar.addfile(ti, io.BytesIO(m[1]))
    return path


def _manifest(members: list[tuple[str, bytes]], edit) -> list[tuple[str, bytes]]:
    """The members with the manifest edited by `edit(dict)` and re-sealed (canonical JSON, new self-hash)."""
    m = json.loads(members[0][1])
    edit(m)
    del m["manifest_sha256"]
    canon = lambda o: json.dumps(o, sort_keys=True, separators=(",", ":")).encode()  # noqa: E731
    m["manifest_sha256"] = _sha(canon(m))
    return [(MANIFEST_NAME, canon(m)), *members[1:]]


def _link(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, target
    return ti


def _flip(members, i):
    name, data = members[i]
    return [*members[:i], (name, data[:100] + bytes([data[100] ^ 1]) + data[101:]), *members[i + 1:]]


def _truncate(path: Path, members) -> Path:
    _write(path, members)
    with tarfile.open(path) as tar:
        cut = tar.getmembers()[1].offset_data + 10  # inside the first artifact's data
    path.write_bytes(path.read_bytes()[:cut])
    return path


def _trailing(path: Path, members) -> Path:
    _write(path, members)
    path.write_bytes(path.read_bytes() + b"hidden")
    return path


def _junk_artifact(members):
    junk = b"not a kvgraft artifact at all" * 4
    aid = _sha(junk)
    edited = _manifest(members, lambda m: m["artifacts"].append({"id": aid, "size": len(junk), "sha256": aid,
                                                                 "tags": []}))
    return [*edited, (id_to_relpath(aid), junk)]


def _with_id_listed_twice(m):
    m["artifacts"].append(dict(m["artifacts"][0]))


# name -> (build(path, members) -> path, message the error must contain)
HOSTILE = {
    "traversal": (lambda p, ms: _write(p, [*ms, ("../evil", b"x")]), "unsafe path"),
    "traversal_inside": (lambda p, ms: _write(p, [*ms, ("objects/../../evil", b"x")]), "unsafe path"),
    "absolute": (lambda p, ms: _write(p, [*ms, ("/tmp/evil", b"x")]), "unsafe path"),
    "symlink": (lambda p, ms: _write(p, [*ms, _link("objects/ab/evil", tarfile.SYMTYPE, "/etc/passwd")]),
                "symbolic link"),
    "hardlink": (lambda p, ms: _write(p, [*ms, _link("objects/ab/evil", tarfile.LNKTYPE, ms[1][0])]), "hard link"),
    "device": (lambda p, ms: _write(p, [*ms, _link("dev", tarfile.CHRTYPE)]), "character device"),
    "directory": (lambda p, ms: _write(p, [_link("objects", tarfile.DIRTYPE), *ms]), "directory"),
    "pax_header": (lambda p, ms: _write(p, [*ms, ("x" * 120, b"x")], tarfile.PAX_FORMAT), "pax extended header"),
    "truncated": (_truncate, "truncated"),
    "bad_hash": (lambda p, ms: _write(p, _flip(ms, 1)), "hashes to"),
    "duplicate_id": (lambda p, ms: _write(p, _manifest(ms, _with_id_listed_twice)), "listed twice"),
    "duplicate_member": (lambda p, ms: _write(p, [*ms, ms[1]]), "appears twice"),
    "unlisted_member": (lambda p, ms: _write(p, [*ms, ("objects/00/" + "0" * 62, b"x")]), "not listed"),
    "missing_member": (lambda p, ms: _write(p, ms[:-1]), "missing"),
    "oversized_manifest": (lambda p, ms: _write(p, [(MANIFEST_NAME, b" " * ((16 << 20) + 1)), *ms[1:]]),
                           "over the 16 MiB limit"),
    "bad_manifest_hash": (lambda p, ms: _write(p, [(MANIFEST_NAME, ms[0][1][:-67] + b'"' + b"0" * 64 + b'"}'),
                                                   *ms[1:]]), "manifest_sha256 does not match"),
    "manifest_not_first": (lambda p, ms: _write(p, [*ms[1:], ms[0]]), "not kvgraft-bundle.json"),
    "not_admissible": (lambda p, ms: _write(p, _junk_artifact(ms)), "refused by admission"),
    "data_after_end": (_trailing, "after the end-of-archive"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_bundle_is_refused_and_the_store_is_unchanged(case, source, target, tmp_path):
    store, ids, files = source
    good = export_bundle(store, ids, tmp_path / "good.kvb", attachments=files).path
    build, message = HOSTILE[case]
    bad = build(tmp_path / "bad.kvb", _members(good))
    before, listing = _tree(target.root), target.list()
    with pytest.raises(BundleError, match=message) as e:
        import_bundle(bad, target, attachments_dir=tmp_path / "files")
    assert str(bad) in str(e.value) and "kvstore export" in str(e.value)
    assert _tree(target.root) == before and target.list() == listing
    assert not (tmp_path / "files").exists() and not (tmp_path / "evil").exists()


def test_a_folder_holding_other_bytes_under_an_attachment_name_is_refused_before_anything_is_written(
        source, target, tmp_path):
    store, ids, files = source
    export_bundle(store, ids, tmp_path / "b.kvb", attachments=files)
    other = tmp_path / "other"
    other.mkdir()
    (other / "z.bin").write_bytes(b"someone else's")
    before = _tree(target.root)
    with pytest.raises(BundleError, match="holds other files"):
        import_bundle(tmp_path / "b.kvb", target, attachments_dir=other)
    assert _tree(target.root) == before and sorted(p.name for p in other.iterdir()) == ["z.bin"]


@pytest.mark.parametrize("fail_at", ["object", "attachment"])
def test_a_failure_while_publishing_removes_what_the_import_added(fail_at, source, target, tmp_path, monkeypatch):
    store, ids, files = source
    export_bundle(store, ids, tmp_path / "b.kvb", attachments=files)
    before, listing = _tree(target.root), target.list()
    import kvstore.bundle.bundle
    import kvstore.store.local

    calls = []
    real, real_copy = kvstore.store.local.atomic_write, kvstore.bundle.bundle._copy_attachment

    def interrupt(path):
        calls.append(path)
        if (fail_at == "object" and len(calls) == 2) or (fail_at == "attachment" and path.name == "z.bin"):
            raise KeyboardInterrupt("interrupted")  # an interrupt mid-publish, not only an error

    def flaky(path, data):
        interrupt(path)
        real(path, data)

    def flaky_copy(f, member, path, name, where):  # an attachment is streamed from the bundle to its file
        interrupt(path)
        real_copy(f, member, path, name, where)

    monkeypatch.setattr(kvstore.store.local, "atomic_write", flaky)
    monkeypatch.setattr(kvstore.bundle.bundle, "_copy_attachment", flaky_copy)
    with pytest.raises(KeyboardInterrupt):
        import_bundle(tmp_path / "b.kvb", target, attachments_dir=tmp_path / "files")
    assert len(calls) >= 2
    after = {k: v for k, v in _tree(target.root).items() if not k.startswith("index.sqlite")}
    assert after == {k: v for k, v in before.items() if not k.startswith("index.sqlite")}
    assert target.list() == listing and not (tmp_path / "files").exists()
    monkeypatch.undo()
    import_bundle(tmp_path / "b.kvb", target, attachments_dir=tmp_path / "files")  # and a re-run completes it
    assert all(target.contains(a) for a in ids) and (tmp_path / "files" / "z.bin").read_bytes() == files["z.bin"]


def test_large_imports_are_published_in_bounded_batches(source, target, tmp_path, monkeypatch):
    store, ids, _ = source
    export_bundle(store, ids, tmp_path / "b.kvb")
    import kvstore.bundle.bundle

    calls = []
    real = type(target).put_many
    monkeypatch.setattr(kvstore.bundle.bundle, "PUBLISH_BATCH_BYTES", 1)  # one artifact per put_many
    monkeypatch.setattr(type(target), "put_many", lambda self, items, tags=(): calls.append(tags) or real(self, items, tags))
    assert set(import_bundle(tmp_path / "b.kvb", target).added) == set(ids)
    assert len(calls) == 3 and all(ArtifactId.of(target.get_bytes(a)) == a for a in ids)


_KILLED_MID_PUBLISH = """
import os, signal, sys
import kvstore.store.local
from kvstore import LocalStore
from kvstore.bundle.bundle import import_bundle
real, calls = kvstore.store.local.atomic_write, []
def dying(path, data):
    calls.append(path)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 between object writes, before the index transaction
    real(path, data)
kvstore.store.local.atomic_write = dying
import_bundle(sys.argv[1], LocalStore(sys.argv[2]))
"""


def test_a_kill_9_mid_publish_leaves_only_valid_objects_and_a_rerun_completes(source, target, tmp_path):
    store, ids, _ = source
    export_bundle(store, ids, tmp_path / "b.kvb")
    listing = target.list()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _KILLED_MID_PUBLISH, str(tmp_path / "b.kvb"), str(target.root)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == -9, proc.stderr
    objects = [p for p in (target.root / "objects").glob("*/*") if not p.name.startswith(".")]
    assert len(objects) == 1 + 2  # the artifact it had + the two written before the kill
    assert all(ArtifactId.of(p.read_bytes()) == p.parent.name + p.name for p in objects)
    rows = {i.id for i in target.list()}  # the first tag group's batch was committed, the second was not
    assert {i.id for i in listing} < rows < {i.id for i in listing} | set(ids)
    assert all(target.contains(a) for a in rows)
    import_bundle(tmp_path / "b.kvb", target)
    assert {i.id for i in target.list()} == {i.id for i in listing} | set(ids)
    assert all(target.info(a).tags == store.info(a).tags for a in ids)


# --------------------------------------------------------------------------------------------- exact after import

_GRAFT_IN_FRESH_PROCESS = """
import json, sys
from kvstore import LocalStore, load_backend
from kvstore.bundle.bundle import import_bundle
from kvstore.engine.verify import graft_logits, logits_sha256, reference_logits
bundle, root, files, aid, prefix, suffix = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], *map(json.loads, sys.argv[5:])
be = load_backend("transformers", source="tiny-gemma3")
store = LocalStore(root)
info = import_bundle(bundle, store, attachments_dir=files)
assert info.claims == (aid,) and store.numerics_record(aid).fingerprints == ()  # another machine's claim (issue 61)
assert store.put(be.deposit(prefix)) == aid  # re-verified here by reproduction: the same bytes, measured
g = graft_logits(be, prefix, suffix, store=store, artifact_id=aid).logits
r = reference_logits(be, prefix, suffix)
print(json.dumps({"added": list(info.added), "graft": logits_sha256(g), "reference": logits_sha256(r)}))
"""


def test_an_artifact_grafts_exactly_after_import_in_a_fresh_process(tiny_gemma3, tmp_path):
    from kvstore.backends.transformers import TransformersBackend

    prefix = [2, *range(10, 40)]  # 31 tokens: past tiny-gemma3's sliding window of 16
    suffix = [50, 61, 72, 83]
    store = LocalStore(tmp_path / "src")
    aid = store.put(TransformersBackend.of(tiny_gemma3).deposit(prefix), tags=["library:demo"])
    export_bundle(store, [aid], tmp_path / "lib.kvb", attachments=FILES)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _GRAFT_IN_FRESH_PROCESS, str(tmp_path / "lib.kvb"),
                           str(tmp_path / "dst"), str(tmp_path / "lib2"), aid, json.dumps(prefix), json.dumps(suffix)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["added"] == [aid]
    assert out["graft"] == out["reference"]
    assert (tmp_path / "dst" / id_to_relpath(aid)).read_bytes() == store.get_bytes(aid)
    assert {p.name: p.read_bytes() for p in (tmp_path / "lib2").iterdir()} == FILES


# --------------------------------------------------------------------------------------------- the command line


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_export_and_import_by_ids_tag_and_attached_files(source, tmp_path, capsys):
    store, ids, files = source
    rc, out, err = _cli(capsys, "export", "--store", str(store.root), ids[0][:10], ids[2], "-o", str(tmp_path / "i.kvb"))
    assert rc == 0, err
    assert out.strip() == str(tmp_path / "i.kvb") and "2 artifacts" in err
    rc, out, err = _cli(capsys, "export", "--store", str(store.root), "--tag", "demo", "-o", str(tmp_path / "t.kvb"))
    assert rc == 0 and "2 artifacts" in err and _sha((tmp_path / "t.kvb").read_bytes()) in err
    (tmp_path / "notes.txt").write_bytes(files["notes.txt"])
    rc, out, err = _cli(capsys, "export", "--store", str(store.root), "--tag", "demo", "--attach",
                        str(tmp_path / "notes.txt"), "-o", str(tmp_path / "l.kvb"))
    assert rc == 0 and "attachments notes.txt" in err
    dst = tmp_path / "dst"
    rc, out, err = _cli(capsys, "import", str(tmp_path / "l.kvb"), "--store", str(dst), "--attachments-dir",
                        str(tmp_path / "lib2"))
    assert rc == 0, err
    assert "2 new" in out and (tmp_path / "lib2" / "notes.txt").read_bytes() == files["notes.txt"]
    rc, out, err = _cli(capsys, "import", str(tmp_path / "i.kvb"), "--store", str(dst))
    assert rc == 0 and "1 new, 1 already present" in out
    assert {i.id for i in LocalStore(dst).list()} == set(ids)


def test_cli_import_of_a_bundle_with_attachments_without_a_folder_says_they_were_not_written(source, tmp_path,
                                                                                             capsys):
    store, ids, files = source
    export_bundle(store, ids, tmp_path / "l.kvb", attachments=files)
    rc, out, err = _cli(capsys, "import", str(tmp_path / "l.kvb"), "--store", str(tmp_path / "dst"))
    assert rc == 0 and "--attachments-dir" in err and "notes.txt" in err


def test_cli_errors_exit_2_with_one_line_naming_the_problem(source, tmp_path, capsys):
    store, ids, _ = source
    rc, _, err = _cli(capsys, "export", "--store", str(store.root), "-o", str(tmp_path / "x.kvb"))
    assert rc == 2 and "give artifact ids or --tag" in err
    rc, _, err = _cli(capsys, "export", "--store", str(store.root), "--tag", "demo", ids[0], "-o",
                      str(tmp_path / "x.kvb"))
    assert rc == 2 and "only one of" in err
    rc, _, err = _cli(capsys, "export", "--store", str(store.root), "--tag", "nothing", "-o", str(tmp_path / "x.kvb"))
    assert rc == 2 and "nothing to export" in err
    good = export_bundle(store, ids, tmp_path / "good.kvb").path
    bad = _write(tmp_path / "bad.kvb", [*_members(good), _link("objects/ab/evil", tarfile.SYMTYPE, "/etc/passwd")])
    rc, out, err = _cli(capsys, "import", str(bad), "--store", str(tmp_path / "dst"))
    assert rc == 2 and out == ""
    assert err.startswith("kvstore: error: ") and "objects/ab/evil" in err and "symbolic link" in err
    assert len(err.strip().splitlines()) == 1 and len(LocalStore(tmp_path / "dst")) == 0


def test_to_bytes_of_the_imported_snapshot_is_the_exported_artifact(source, tmp_path):
    store, ids, _ = source
    export_bundle(store, ids, tmp_path / "b.kvb")
    mem = MemoryStore()
    import_bundle(tmp_path / "b.kvb", mem)
    assert all(ArtifactId.of(to_bytes(mem.get(a))) == a for a in ids)
